"""``python -m experiments NAME [--smoke] [--seeds N] [--out DIR] [--check]``: see `experiments.runner`."""
import sys

from experiments.runner import experiment_command

if __name__ == "__main__":
    sys.exit(experiment_command(sys.argv[1:]))
