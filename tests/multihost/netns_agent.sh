#!/bin/sh
# Open MPI's remote launcher (plm_rsh_agent) for tests/multihost: where ssh
# would log in to HOST and run the command, this runs it in the network
# namespace that plays HOST on this machine, with its own host name (a UTS
# namespace), so the "hosts" share nothing but the file system and the veth.
#   netns_agent.sh [ssh-style options] HOST COMMAND...
# ZT_MH_HOSTS maps addresses to namespaces: "10.77.0.1=ns-a 10.77.0.2=ns-b".
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
ns=
for pair in $ZT_MH_HOSTS; do
  [ "${pair%%=*}" = "$host" ] && ns=${pair#*=}
done
if [ -z "$ns" ]; then
  echo "netns_agent.sh: no namespace plays host $host (ZT_MH_HOSTS=$ZT_MH_HOSTS)" >&2
  exit 255
fi
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns; $*"
