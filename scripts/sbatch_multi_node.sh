#!/bin/bash
# lit_ddp on several SLURM nodes: one task per GPU on each node (Lightning reads SLURM's variables).
#   sbatch scripts/sbatch_multi_node.sh [extra CLI args, e.g. --config configs/presets/debug.yaml]
# Edit the #SBATCH lines for your cluster (partition, account, GPUs); the srun line follows them.
#SBATCH --job-name=lit_ddp
#SBATCH --nodes=4
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

# Rank 0's node hosts the rendezvous: Lightning takes MASTER_ADDR from the first host of $SLURM_NODELIST
# and MASTER_PORT from the job id (15000 + its last 4 digits); export either to override. All nodes must
# reach that host and port. default_root_dir (logs/) must be on a filesystem every node shares.

set -euo pipefail
# The recipe: $CONFIG if set (CONFIG=configs/resnet_imagenet.yaml sbatch ...), else DEFAULT_CONFIG.
DEFAULT_CONFIG=configs/lenet_cifar.yaml
CONFIG=${CONFIG:-$DEFAULT_CONFIG}

srun --kill-on-bad-exit=1 python -m lit_ddp fit --config "$CONFIG" \
    --trainer.num_nodes="$SLURM_NNODES" --trainer.devices="$SLURM_NTASKS_PER_NODE" --trainer.strategy=ddp \
    --ckpt_path=last "$@"
