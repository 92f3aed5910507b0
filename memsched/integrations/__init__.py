"""memsched.integrations: a memsched schedule inside the training stacks users train with (docs/integrations.md).

One module per stack, each a callback that decides *when* a plan is applied (the stack's train begin) and
removed (its train end); the runtime's `apply_schedule` carries the plan out, and nothing here replays anything:

- `memsched.integrations.hf`: `MemschedCallback`, a `transformers.TrainerCallback` (`pip install 'memsched[hf]'`).
- `memsched.integrations.lightning`: `MemschedCallback`, a `lightning.pytorch.Callback`
  (`pip install 'memsched[lightning]'`).

Each takes a solved `schedule=`, or a `trace=` to solve under `budget=`, or only `budget=`: then it traces the
first steps of the run itself (on the stack's own model, optimizer and first batch, with the training state put
back afterwards), solves, and applies. This package imports neither stack; import the module of yours.
"""
