"""The config: schema.py (one dataclass per config group, the closed choices and ranges; compose_config,
check_overrides, typed: the composed config typed once at each entry point), fields.py (the field declarations and
their one checking walk), execution.py (local or Ray), model.py (load the backend the config names), identity.py
(RunIdentity: a run's comparable and resume keys, recorded config and manifest inputs, each setting's "absent" rule
declared once)."""
