"""CPU-only scheduling and KV-block bookkeeping. Never imports torch. The package imports
nothing itself: every command reads its settings (service_config.py) without the scheduler."""
