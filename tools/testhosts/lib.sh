# shellcheck shell=bash disable=SC2034  # settings used by the scripts that source this file
# Settings shared by tools/testhosts/rig and its helpers. Source this file; it sets no shell options.
TH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$TH_DIR/../.." && pwd)
RIG_HOME=${RIG_HOME:-$REPO_ROOT/.rig}
RIG_ID=${RIG_ID:-0}
if [[ ! $RIG_ID =~ ^([0-9]|[1-9][0-9])$ ]]; then
  echo "rig: RIG_ID must be 0-99 (no leading zero), got '$RIG_ID'" >&2
  exit 2
fi
NET=10.231.$RIG_ID                    # this instance's subnet, used ONLY on $BR and inside our netns
CTRL_IP=$NET.1                        # controller's address on the bridge
GW_IP=$NET.254                        # default gateway that does NOT exist: nothing leaves the bridge
BR=mift${RIG_ID}br                    # bridge in the root namespace
STATE=$RIG_HOME/$RIG_ID               # per-instance state (hosts' upper dirs, pids, inventory)
BASE_PLAIN=$RIG_HOME/base/rootfs      # shared read-only lower layers (all RIG_IDs)
BASE_SYSTEMD=$RIG_HOME/base-systemd/rootfs
REPO=$RIG_HOME/repo                   # served on http://controller:8080/ (debs/, pypi/, amd/)
SSH_KEY=$RIG_HOME/ssh/id_ed25519
SSH_CFG=$RIG_HOME/ssh/config
HTTP_PORT=8080
PROFILES=(mi300x mi300x-vf mi300x-cpx mi250x mi210 mi300x-rocminfo4 mi300x-amdsmi-cut)
DEFAULT_PROFILE=mi300x
MAX_HOSTS=128                          # addresses .11-.138 of the subnet; 64 measured here (bench/control_plane_scale.py)

host_ip()   { echo "$NET.$((10 + $1))"; }     # host1 -> 10.231.<ID>.11
host_name() { echo "host$1"; }
host_ns()   { echo "mift${RIG_ID}h$1"; }      # netns name
host_veth() { echo "mift${RIG_ID}h$1v"; }     # root-side veth end (<= 15 chars)
host_cg()   { echo "mift${RIG_ID}h$1"; }      # per-host cgroup name (systemd mode)
host_dir()  { echo "$STATE/hosts/$1"; }
# CPU accounting of the hosts (cgroup v1 cpuacct, where the controller has it): one cgroup per rig that every host
# process of the rig runs in, kept across up/down so that its count adds up (`rig cpu`; .ci/run's cpu-s column)
CPU_CG_ROOT=/sys/fs/cgroup/cpuacct/mift-cpu
cpu_cg()    { echo "$CPU_CG_ROOT/rig$RIG_ID"; }

die() { echo "rig: $*" >&2; exit 1; }
log() { echo "rig[$RIG_ID]: $*"; }

# pid_alive PID: true if PID exists and is not a zombie
pid_alive() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z ]]
}

# cmdline PID: the process's command line with spaces (empty if gone)
cmdline() { { tr '\0' ' ' < "/proc/$1/cmdline"; } 2>/dev/null || true; }

# wait_gone PID [TENTHS]: until PID has exited or is a zombie; false on timeout
wait_gone() {
  local t
  for ((t = 0; t < ${2:-50}; t++)); do
    pid_alive "$1" || return 0
    sleep 0.1
  done
  return 1
}
