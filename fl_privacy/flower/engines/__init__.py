"""Where a Flower deployment runs, one module an engine.

- `inprocess`: `InProcessGrid` and `run` (a strategy and N ClientApps in one process).
- `jobs`: a deployment of `flower_audit` as a `Job` (data: `codec`) and its two sides
  (`serve`); `codec`: jobs and results as tagged JSON, no pickle.
- `simulation`: Flower's Simulation Engine (`flwr run` against a simulation-mode SuperLink,
  Ray). `deployment`: a local Deployment Engine (`LocalDeployment`: SuperLink and SuperNode
  processes, `flwr run flower_app`, the job in the run config); `processes`: their ports,
  environment and process groups; `watchdog.py`: kills them when the driver dies; `sizes`:
  how many nodes this machine's total memory holds.
- `dispatch`: `run_job(engine, job)`, the one entry point the parts call.
- `app`: the Flower App's components (`flower_app/pyproject.toml`).
"""
