"""The solvers: constraints, the chain DP, the MILP (formulation and solve), Lagrangian
bounds, the throughput objective, AutoPartition (the planner that picks among them), the
diagnosis of infeasible problems, and the baselines."""
