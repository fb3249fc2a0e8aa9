"""Where a Flower deployment runs, one module an engine.

- `inprocess`: `InProcessGrid` and `run` (a strategy and N ClientApps in one process).
- `jobs`: a deployment of `flower_audit` as a picklable `Job` and its two sides (`serve`).
- `simulation`: Flower's Simulation Engine (Ray). `deployment`: a local Deployment Engine
  (`LocalDeployment`: SuperLink and SuperNode processes, `flwr run flower_app`).
- `dispatch`: `run_job(engine, job)`, the one entry point the parts call.
- `app`: the Flower App's components (`flower_app/pyproject.toml`).
"""
