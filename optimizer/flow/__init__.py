"""One solve's phases (docs/formulation.md, 'How solve() uses it'). `Flow` (phases.py) holds the candidates and the
best true bound (state.py); the phases that find plans (answers.py) and those that prove bounds (bounds.py) add to
them, each within its share of the time limit (shares.py); the MILP backends are in backends.py and the answer's
record in report.py. optimizer/solve.py decides which phases run, in what order."""
