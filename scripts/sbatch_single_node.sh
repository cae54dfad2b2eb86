#!/bin/bash
# lit_ddp on one SLURM node: one task per GPU, Lightning reads SLURM's variables (SLURMEnvironment).
#   sbatch scripts/sbatch_single_node.sh [extra CLI args, e.g. --config configs/presets/debug.yaml]
# Edit the #SBATCH lines for your cluster (partition, account, GPUs); the srun line follows them.
#SBATCH --job-name=lit_ddp
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=SIGUSR1@90
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
#
# --signal=SIGUSR1@90: 90 s before the time limit every task gets SIGUSR1; lit_ddp stops all ranks at the
# next batch, writes last.ckpt and runs `scontrol requeue`. --requeue lets SLURM restart the job (also after
# a preemption), and --ckpt_path=last below makes every start continue from the newest last.ckpt.
# --kill-on-bad-exit=1: if one task dies, srun kills the others at once instead of letting them hang.

set -euo pipefail
# The recipe: $CONFIG if set (CONFIG=configs/resnet_imagenet.yaml sbatch ...), else DEFAULT_CONFIG.
DEFAULT_CONFIG=configs/lenet_cifar.yaml
CONFIG=${CONFIG:-$DEFAULT_CONFIG}

srun --kill-on-bad-exit=1 python -m lit_ddp fit --config "$CONFIG" \
    --trainer.num_nodes="$SLURM_NNODES" --trainer.devices="$SLURM_NTASKS_PER_NODE" --trainer.strategy=ddp \
    --ckpt_path=last "$@"
