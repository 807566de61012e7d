#!/bin/bash
# zero-train across two "hosts" on this machine (docs/zero-train.md, "Across hosts"):
#   tests/multihost/multihost.sh BUILD_ROOT
#
# Two network namespaces joined by a veth pair play two hosts (each also gets
# its own host name); Open MPI's TCP transport carries every message between
# them (btl tcp,self: no shared memory), and mpirun starts the remote daemon
# through netns_agent.sh instead of ssh. Checks:
#   1. ZeRO stage 3, 2 hosts x 1 rank and 2 hosts x 2 ranks: every step's loss
#      and grad norm, and the final master weights and moments (zero-ckpt
#      diff), bitwise equal to the same run on one host over shared memory.
#   2. The link cut mid-run (ip link set ... down): every rank fails with the
#      named timeout within train.comm_timeout_s (+ slack), nobody hangs.
# Exit 77 (skip) without root, iproute2, unshare or Open MPI, or where network
# namespaces cannot be created. The namespaces (and every process in them)
# are removed on every exit path.
set -u
build=${1:?usage: multihost.sh BUILD_ROOT}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
train=$build/tools/train/zero-train
ckpt=$build/tools/ckpt/zero-ckpt

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "no ip command (apt-get install iproute2)"
command -v unshare >/dev/null || skip "no unshare (util-linux)"
command -v mpirun >/dev/null || skip "no mpirun (Open MPI)"
[ -x "$train" ] && [ -x "$ckpt" ] || skip "zero-train or zero-ckpt not built in $build"

tag=$$
A=zt-mh-a-$tag B=zt-mh-b-$tag VA=vza$tag VB=vzb$tag
work=$(mktemp -d /tmp/zt-multihost.XXXXXX)
cleanup() {
    for ns in "$A" "$B"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$A" 2>/dev/null || skip "cannot create a network namespace (no CAP_SYS_ADMIN?)"
ip netns add "$B" || fail "ip netns add $B"
ip link add "$VA" type veth peer name "$VB" || skip "cannot create a veth pair"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" &&
    ip -n "$A" addr add 10.77.0.1/24 dev "$VA" && ip -n "$B" addr add 10.77.0.2/24 dev "$VB" &&
    ip -n "$A" link set lo up && ip -n "$B" link set lo up &&
    ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up || fail "setting up the veth link"

printf '10.77.0.1 slots=2\n10.77.0.2 slots=2\n' > "$work/hosts"
export ZT_MH_HOSTS="10.77.0.1=$A 10.77.0.2=$B"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# mpirun on "host" A (its own host name too); the daemon of host B started by
# the agent. Only TCP (also between two ranks of one host), only on the veth
# subnet. --map-by node: rank r on host r % 2. Usage: launch NP program args...
launch() {
    local np=$1; shift
    ip netns exec "$A" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$A" \
        mpirun -np "$np" --map-by node --hostfile "$work/hosts" --mca plm_rsh_agent "$here/netns_agent.sh" \
        --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
        --mca oob_tcp_if_include 10.77.0.0/24 -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x ZT_MH_HOSTS "$@"
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# 0. the ranks really run on two "hosts"
names=$(timeout 60 bash -c "$(declare -f launch); $(declare -p A work here); launch 2 hostname" | sort | tr '\n' ' ')
[ "$names" = "$A $B " ] || fail "ranks ran on [$names], expected one on each of $A and $B"
echo "ranks on two hosts: $names"

# 1. bitwise equal to one host, with 1 and 2 ranks per host; on the frozen corpus
# (tests/python/train_helpers.py corpus()), not a live source file an edit would change
gzip -dc "$src/tests/python/data/corpus.txt.gz" > "$work/corpus.txt"
args=(--plain --set model.n_layer=2 --set model.n_head=2 --set model.d_model=32 --set model.seq_len=16
      --micro-batch 4 --set optimizer.params.lr=0.01 --set scheduler.params.warmup_num_steps=2
      --set scheduler.params.total_num_steps=40 --data "$work/corpus.txt" --stage 3 --steps 8)
# each step's loss and grad norm as printed (17 significant digits)
steps() { sed -E 's/.*("loss": [^,]*).*("grad_norm": [^,]*).*/\1 \2/' "$1"; }
for per_host in 1 2; do
    np=$((2 * per_host)); t1=$(now)
    two=$work/two-$np one=$work/one-$np
    timeout 300 bash -c "$(declare -f launch); $(declare -p A work here); launch \"\$@\"" _ $np \
        "$train" "${args[@]}" --metrics "$two.jsonl" --checkpoint-dir "$two.ck" > "$two.out" 2>&1 ||
        { cat "$two.out"; fail "the 2-host run with $np ranks failed"; }
    timeout 300 "$src/tests/mpirun.sh" $np "$train" "${args[@]}" --metrics "$one.jsonl" \
        --checkpoint-dir "$one.ck" > "$one.out" 2>&1 || { cat "$one.out"; fail "the 1-host run with $np ranks failed"; }
    [ "$(steps "$two.jsonl" | wc -l)" = 8 ] || fail "the 2-host run logged $(wc -l < "$two.jsonl") steps, not 8"
    if ! diff <(steps "$one.jsonl") <(steps "$two.jsonl") > "$work/steps.diff"; then
        cat "$work/steps.diff"
        fail "$np ranks: per-step loss / grad norm differ between 1 host and 2 hosts"
    fi
    "$ckpt" diff "$one.ck" "$two.ck" || fail "$np ranks: final master weights / moments differ (zero-ckpt diff)"
    echo "2 hosts x $per_host rank(s), ZeRO-3, 8 steps: losses, grad norms and final state bitwise equal to 1 host ($(elapsed "$t1") s)"
done

# 2. cut the link mid-run: every rank reports the named timeout within the deadline
deadline=5
out=$work/cut
bash -c "$(declare -f launch); $(declare -p A work here); launch \"\$@\"" _ 2 --output-filename "$out" "$train" "${args[@]}" --steps 1000000 --log-every 1000000 \
    --comm-timeout "$deadline" --metrics "$work/cut.jsonl" > "$work/cut.mpirun" 2>&1 &
disown
for _ in $(seq 600); do
    [ -f "$work/cut.jsonl" ] && [ "$(wc -l < "$work/cut.jsonl")" -ge 3 ] && break
    sleep 0.1
done
[ "$(wc -l < "$work/cut.jsonl" 2>/dev/null || echo 0)" -ge 3 ] || { cat "$work/cut.mpirun"; fail "the run to cut did not start"; }
ip -n "$A" link set "$VA" down || fail "ip link set $VA down"
t0=$(now)
declare -A took
for _ in $(seq 600); do
    for r in 0 1; do
        f=$out/1/rank.$r/stderr
        if [ -z "${took[$r]:-}" ] && [ -f "$f" ] && grep -q "timed out after $deadline.0 s" "$f"; then
            took[$r]=$(elapsed "$t0")
        fi
    done
    [ -n "${took[0]:-}" ] && [ -n "${took[1]:-}" ] && break
    sleep 0.1
done
for r in 0 1; do
    f=$out/1/rank.$r/stderr
    [ -n "${took[$r]:-}" ] || { cat "$f" 2>/dev/null; fail "rank $r: no named timeout within 60 s of the cut"; }
    echo "rank $r, ${took[$r]} s after the cut: $(grep -m1 'timed out' "$f")"
    # the deadline, plus the step under way (milliseconds) and polling; 3x for a loaded machine
    awk -v t="${took[$r]}" -v d="$deadline" 'BEGIN { exit !(t < 3 * d) }' ||
        fail "rank $r took ${took[$r]} s to fail (deadline $deadline s)"
done
echo "link cut: every rank failed with the named timeout within the deadline"
exit 0
