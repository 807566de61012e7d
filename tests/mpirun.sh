#!/bin/sh
# Run a test under Open MPI with N real ranks on this machine:
#   tests/mpirun.sh N program [args...]
# --oversubscribe allows more ranks than cores; yield_when_idle keeps ranks
# that wait from spinning on the two cores CI has; running as root (CI) must
# be allowed explicitly.
n=$1; shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Only the shared-memory and self transports: tests never leave this machine.
export OMPI_MCA_btl=self,vader
# One OpenMP pool per rank, sized to this rank's share of the cores: N ranks
# that each start nproc threads oversubscribe the machine many times over.
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  t=$(( $(nproc) / n )); [ "$t" -ge 1 ] || t=1
  export OMP_NUM_THREADS=$t
fi
exec mpirun -np "$n" --oversubscribe --bind-to none "$@"
