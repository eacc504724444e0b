"""``numarun tune``: pure parts (candidates, schedule, stats, measure, chart); the runner is
``numarun.commands.tune``."""
