"""The `flower_audit` experiment: `pipeline` (validation, plan, figures) and its parts.

`common` (the clients' model, the engine, the job folders) and `config_checks` serve every
part; `fedmia`, `dishonest` and `reconstruction` each run one part's deployments (`dp` and
`training` call `audits`; `torch_part` runs the PyTorch + Opacus app of `flower_torch_app/`);
`tables` writes `flower_audit.md` and the figure.
"""
