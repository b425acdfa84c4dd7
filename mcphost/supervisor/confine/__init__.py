"""The confinement wing: what holds an agent in, from the kernel's side.

- `fence`: the fence (its pure plan and bubblewrap command line, and that plan ready to run
  here); `probe`: what this machine offers it (Landlock, user namespaces, bubblewrap). The
  child's entry steps (cgroup entry, user switch, keyring, Landlock) and the tmux pane's gate
  that runs them are mcphost/gate.py, a standard-library-only script on the ground floor.
- `cgroups`: the agents' cgroups (limits, entry, v1 and v2) and `usage`: their figures.
- `kernel`: prctl wrappers, the child's set-up, users, and the reaper of children and adopted
  processes.

Beside `center` on one floor, below the agents; it imports nothing of the supervisor above it.
"""
