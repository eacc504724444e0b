"""numarun's reference trainer. Run it under numarun with Hydra overrides:

    numarun scripts/train.py parallel=fsdp model=gpt trainer.batch_size=32 launcher.binding=exclusive

numarun composes configs/ once into the run dir; every rank reads that config.yaml.
"""

from numarun.train import exit_now, main

if __name__ == "__main__":
    exit_now(main())
