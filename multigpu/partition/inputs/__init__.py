"""The planner's inputs: clusters (devices, links, hosts), layer graphs, and the checks of
the values read from their files."""
