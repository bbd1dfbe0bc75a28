"""Train the model: one process, or many started by run.sh.

python run.py [--epochs N ...]      one process (CPU or one GPU)
NPROC_PER_NODE=2 bash run.sh ...    several processes, with the chosen launcher

The job itself, step by step, is {{ cookiecutter.project_slug }}/training.py.
"""

from {{ cookiecutter.project_slug }}.errors import ended_quietly_by_ctrl_c

with ended_quietly_by_ctrl_c():  # while the framework loads
    from {{ cookiecutter.project_slug }} import cli, distributed, modelarts, preflight
    from {{ cookiecutter.project_slug }}.training import train

if __name__ == "__main__":
    args = cli.parse_args()
    modelarts.start_this_machine(args)  # ModelArts: `python run.py --init_method ...` runs this machine's part
    distributed.launch(preflight.check if args.check else train, args)
