"""The confinement wing: what holds an agent in, from the kernel's side.

- `fence`: the fence (bubblewrap plan and command line, the machine probe, the child's entry
  steps and the standard-library-only tmux gate).
- `cgroups`: the agents' cgroups (limits, entry, v1 and v2) and `usage`: their figures.
- `kernel`: prctl wrappers, the child's set-up, users, and the reaper of children and adopted
  processes.

Beside `center` on one floor, below the agents; it imports nothing of the supervisor above it.
"""
