"""The operator's wing: what a person or a scraper sees and asks of the running supervisor.

- `ctl`: `mcphost ctl`, the command, on the control client only (it never imports the rest);
  `ctlview`: what it prints (the status table, `top`'s frames, an agent's log text escaped).
- `operations`: the control operations (status, start, stop, restart, reload, logs, exec).
- `page`: the fleet page (HTML and its JSON) on a loopback listener.
- `metrics`: the Prometheus endpoint (the only module that imports prometheus_client).
- `loopback`: the bounded HTTP listener both of them stand on (connections, deadlines, peers,
  the `Host` guard of `values.Listen`).
- `journal`: the supervisor's own event sinks and the recent records the page shows.
- `notify`: systemd's readiness protocol (sd_notify: READY, RELOADING, STOPPING, STATUS).

It stands on top of the wings below (serving, the reconcile, agents, center, confine); nothing
below imports it.
"""
