"""Every option of every command, declared once and read once, typed, each value with its source
(:mod:`numarun.options.launch`); the choices they take (:mod:`numarun.options.choices`) and torchrun's own options
(:mod:`numarun.options.torchrun`). Below the plan, the job and the launch, which all name their types."""
