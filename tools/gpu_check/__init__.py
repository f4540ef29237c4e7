"""The one-command GPU check (see `tools.gpu_check.run`)."""
