#!/bin/bash
# Start a Ray cluster over this Slurm allocation, run COMMAND against it, stop it.
#
#   slurm/ray_cluster.sh COMMAND...      (inside sbatch/salloc; slurm/hpsearch.sbatch calls it)
#
# The head runs on the allocation's first node, one worker on each other node, each through
# `srun` (a job step per node, so Slurm confines it to the node's allocated GPUs and CPUs). Each
# node offers Ray the GPUs Slurm gave it (SLURM_GPUS_ON_NODE) and its CPUs (SLURM_CPUS_PER_TASK,
# else SLURM_CPUS_ON_NODE). COMMAND runs here (on the first node) with --address HEAD:PORT
# appended, and gets RAY_ADDRESS too. At exit the steps started here are stopped by their pids.
#
# Settings (environment): HPSEARCH_RAY_PORT (6379), HPSEARCH_RAY_TEMP (Ray's temp dir; default
# /tmp/ray-$SLURM_JOB_ID), HPSEARCH_RAY_HEAD_ARGS (more `ray start --head` flags, e.g. ports),
# HPSEARCH_DRY_RUN=1 (print the commands, start nothing).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND..." >&2; exit 2; }

dry_run="${HPSEARCH_DRY_RUN:-0}"
port="${HPSEARCH_RAY_PORT:-6379}"
temp_dir="${HPSEARCH_RAY_TEMP:-/tmp/ray-${SLURM_JOB_ID:-local}}"
gpus="${SLURM_GPUS_ON_NODE:-0}"
cpus="${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}"
: "${SLURM_JOB_NODELIST:?not inside a Slurm allocation (sbatch or salloc)}"

# gpu[01-03] -> gpu01 gpu02 gpu03 (scontrol knows Slurm's notation; a plain list needs no expanding)
if command -v scontrol >/dev/null; then
    mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
else
    IFS=, read -r -a nodes <<< "$SLURM_JOB_NODELIST"
fi
head_node="${nodes[0]}"
workers=("${nodes[@]:1}")

run() {  # a command, or its words when dry-running
    if [ "$dry_run" = 1 ]; then echo "$*"; else "$@"; fi
}
pids=()
background() {  # a long-running step; its pid is stopped at exit
    if [ "$dry_run" = 1 ]; then echo "$* &"; else "$@" & pids+=($!); fi
}
stop() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop EXIT

if [ "$dry_run" = 1 ]; then
    head_ip="HEAD_IP"
    echo "srun --nodes=1 --ntasks=1 -w $head_node hostname --ip-address"
else
    head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
fi
address="$head_ip:$port"
# Ray 2.60's `ray start --head` turns on token authentication: the workers and the driver
# present the token the head writes to ~/.ray/auth_token (a home every node shares)
export RAY_AUTH_MODE=token

background srun --nodes=1 --ntasks=1 -w "$head_node" \
    ray start --head --block --node-ip-address="$head_ip" --port="$port" --temp-dir="$temp_dir" \
    --num-cpus="$cpus" --num-gpus="$gpus" --include-dashboard=false --disable-usage-stats ${HPSEARCH_RAY_HEAD_ARGS:-}
# wait for the head to answer, then (below) for every node to join: the search counts the
# trials the cluster holds at once when it starts
wait_for_nodes() { run python "$(dirname "$0")/wait_for_nodes.py" "$address" "$1"; }
wait_for_nodes 1
if [ "${#workers[@]}" -gt 0 ]; then
    worker_list=$(IFS=,; echo "${workers[*]}")
    background srun --nodes="${#workers[@]}" --ntasks="${#workers[@]}" --ntasks-per-node=1 -w "$worker_list" \
        ray start --block --address="$address" --num-cpus="$cpus" --num-gpus="$gpus" --disable-usage-stats
fi
wait_for_nodes "${#nodes[@]}"
export RAY_ADDRESS="$address"
run "$@" --address "$address"
