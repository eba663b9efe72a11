#!/usr/bin/env bash
# e2e-deps.sh installs the real components the e2e tests, the demo and the benchmarks run:
#   etcd 3.4.23 (Debian etcd-server/etcd-client: v2 API and `etcdctl migrate`),
#   etcd/etcdctl/etcdutl 3.5.x and 3.6.x and kube-apiserver/kubectl/kube-controller-manager/
#   kube-scheduler 1.36.x, built from the Go module proxy by the tools modules under e2e/tools/,
#   promtool (taken out of Debian's prometheus package, not installed: checks and tests the
#   alerting rules in deploy/prometheus/), and (with --bench) HAProxy.
# With --promtool it gets promtool only (make alerts-check).
# Binaries land in $KUBEFENCE_BIN_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/kubefence/bin) as
# <component>-<version>; an existing binary is reused, so a second run only checks.
# It prints one line per component saying what it did.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${KUBEFENCE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubefence/bin}
mkdir -p "$bin"
bench=0 only_promtool=0
for arg in "$@"; do
  case $arg in
  --bench) bench=1 ;;
  --promtool) only_promtool=1 ;;
  *)
    printf 'e2e-deps: unknown argument %s (--bench, --promtool)\n' "$arg" >&2
    exit 2
    ;;
  esac
done

say() { printf 'e2e-deps: %s\n' "$*"; }

# version_of MODDIR MODULE prints the version a tools module pins for MODULE.
version_of() { (cd "$root/$1" && go list -m -f '{{.Version}}' "$2"); }

apt_updated=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    say "need Debian packages $* but not root: run 'sudo apt-get install -y $*' and try again" >&2
    exit 1
  fi
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    apt_updated=1
  fi
  # Debian's etcd-server starts its own etcd service on install (2379/2380), under systemd too;
  # the tests start their own. A policy-rc.d that exits 101 makes invoke-rc.d and
  # deb-systemd-invoke start no service during the install (the unit stays enabled for the next
  # boot). An existing policy-rc.d is the host's and is used as it is.
  local policy=/usr/sbin/policy-rc.d ours=0
  if [ ! -e "$policy" ] && [ ! -L "$policy" ]; then
    printf '#!/bin/sh\n# hack/e2e-deps.sh: no service starts during its apt-get install\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    ours=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT # set -e: also when the install fails
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  if [ "$ours" = 1 ]; then
    rm -f "$policy"
    trap - EXIT
  fi
}

# link_or_copy SRC DST puts SRC in the cache under its versioned name.
link_or_copy() { ln -sf "$1" "$2"; }

# promtool, for `make alerts-check`, out of Debian's prometheus package: downloaded and unpacked,
# not installed. Installed, the package is a whole Prometheus server, and under systemd its
# prometheus.service stays enabled: an unauthenticated :9090 from the next boot. It lands as
# promtool-<version> with a promtool link to it; a promtool already there is reused.
get_promtool() {
  if [ -x "$bin/promtool" ]; then
    say "cached: $(basename "$(readlink -f "$bin/promtool")")"
    return
  fi
  if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    say "need promtool (Prometheus 2.x) as $bin/promtool, and no apt-get/dpkg-deb to take it from Debian's prometheus package" >&2
    exit 1
  fi
  local tmp ver
  tmp=$(mktemp -d "$bin/.promtool-XXXXXX")
  # shellcheck disable=SC2064 # $tmp is expanded now, on purpose
  trap "rm -rf '$tmp'" EXIT # set -e: also when a step fails
  chmod 755 "$tmp"          # apt-get downloads as _apt where _apt can reach (else as root)
  if ! (cd "$tmp" && apt-get download prometheus) >"$tmp/apt.log" 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      cat "$tmp/apt.log" >&2
      say "cannot download Debian's prometheus package (for promtool) and not root to run apt-get update: run 'sudo apt-get update' and try again" >&2
      exit 1
    fi
    if [ "$apt_updated" = 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
      apt_updated=1
    fi
    if ! (cd "$tmp" && apt-get download prometheus) >"$tmp/apt.log" 2>&1; then
      cat "$tmp/apt.log" >&2
      say "cannot download Debian's prometheus package (for promtool)" >&2
      exit 1
    fi
  fi
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
  ver=$("$tmp/root/usr/bin/promtool" --version 2>&1 | awk 'NR==1 {print $3}')
  if [ -z "$ver" ]; then
    say "the promtool in Debian's prometheus package does not say its version" >&2
    exit 1
  fi
  mv "$tmp/root/usr/bin/promtool" "$bin/promtool-$ver"
  ln -s "promtool-$ver" "$tmp/promtool"
  mv -fT "$tmp/promtool" "$bin/promtool" # a rename: a concurrent run never sees no promtool
  rm -rf "$tmp"
  trap - EXIT
  say "promtool $ver (from Debian's prometheus package, not installed) -> $bin/promtool-$ver"
}

if [ "$only_promtool" = 1 ]; then
  get_promtool
  exit 0
fi

# A C compiler: make test's go test -race needs cgo, which Go turns off without one ($CC, else
# gcc: go env CC says which).
if ! command -v "$(go env CC 2>/dev/null || echo gcc)" >/dev/null 2>&1; then
  apt_install gcc libc6-dev
  say "installed Debian gcc, libc6-dev (go test -race needs cgo)"
fi

# etcd 3.4 from Debian.
if [ ! -x /usr/bin/etcd ] || [ ! -x /usr/bin/etcdctl ]; then
  apt_install etcd-server etcd-client
  say "installed Debian etcd-server, etcd-client"
fi
# The framework runs etcd-<Etcd34> exactly (e2e/framework/bins.go): a link under another 3.4
# patch's name would leave every test that needs it skipped, or failed under CI, for a binary
# "missing" that is installed.
# pinned CONST is CONST's value in e2e/framework/bins.go: the version the tests run.
pinned() { sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\"\(.*\)\"\$/\1/p" "$root/e2e/framework/bins.go"; }
# check_pinned CONST VERSION MODDIR stops unless the tools module MODDIR builds the version the
# tests run: a binary built under another name would leave the tests on a stale cached one.
check_pinned() {
  local want
  want=$(pinned "$1")
  if [ "$want" != "$2" ]; then
    say "$3/go.mod builds $2, but the tests run $1 = ${want:-unreadable} (e2e/framework/bins.go): change one to match the other" >&2
    exit 1
  fi
}
want34=$(pinned Etcd34)
if [ -z "$want34" ]; then
  say "cannot read the pinned Etcd34 from e2e/framework/bins.go" >&2
  exit 1
fi
v34=$(/usr/bin/etcd --version | awk '/etcd Version/ {print $3}')
if [ "$v34" != "$want34" ]; then
  say "/usr/bin/etcd is ${v34:-unknown}, the e2e tests need $want34 (Etcd34 in e2e/framework/bins.go):" \
    "install Debian's etcd-server/etcd-client $want34 (apt-cache policy etcd-server lists the versions)," \
    "or, if this Debian's 3.4 is the one to test, change Etcd34 to $v34" >&2
  exit 1
fi
link_or_copy /usr/bin/etcd "$bin/etcd-$v34"
link_or_copy /usr/bin/etcdctl "$bin/etcdctl-$v34"
say "etcd $v34 (Debian) -> $bin/etcd-$v34"

# build_tools MODDIR VERSION LDFLAGS NAME=PKG... builds each PKG of a tools module as NAME-VERSION.
build_tools() {
  local dir=$1 ver=$2 ldflags=$3; shift 3
  local missing=()
  for pair in "$@"; do
    local name=${pair%%=*}
    [ -x "$bin/$name-$ver" ] || missing+=("$pair")
  done
  if [ ${#missing[@]} = 0 ]; then
    say "cached: $(for p in "$@"; do printf '%s-%s ' "${p%%=*}" "$ver"; done)"
    return
  fi
  local start=$SECONDS tmp
  tmp=$(mktemp -d "$bin/.build-XXXXXX")
  for pair in "${missing[@]}"; do
    local name=${pair%%=*} pkg=${pair#*=}
    (cd "$root/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$pkg")
    mv "$tmp/$name" "$bin/$name-$ver"
  done
  rmdir "$tmp"
  say "built $(for p in "${missing[@]}"; do printf '%s-%s ' "${p%%=*}" "$ver"; done)in $((SECONDS - start)) s"
}

for m in 3.5 3.6; do
  v=$(version_of "e2e/tools/etcd-$m" go.etcd.io/etcd/server/v3)
  v=${v#v}
  check_pinned "Etcd${m/./}" "$v" "e2e/tools/etcd-$m"
  build_tools "e2e/tools/etcd-$m" "$v" "" \
    etcd=go.etcd.io/etcd/server/v3 etcdctl=go.etcd.io/etcd/etcdctl/v3 etcdutl=go.etcd.io/etcd/etcdutl/v3
done

kv=$(version_of e2e/tools/kube k8s.io/kubernetes)
kv=${kv#v}
check_pinned Kube136 "$kv" e2e/tools/kube
# Stamp the version the way Kubernetes' own build does, so /version and kubectl report 1.36.x.
kldflags="-X k8s.io/component-base/version.gitVersion=v$kv -X k8s.io/component-base/version.gitMajor=${kv%%.*}"
kldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$kv" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean"
kldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=v$kv -X k8s.io/client-go/pkg/version.gitMajor=${kv%%.*}"
kldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=$(echo "$kv" | cut -d. -f2)"
build_tools e2e/tools/kube "$kv" "$kldflags" \
  kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl
# The controller manager and scheduler the leader-election e2e test runs behind the proxy.
build_tools e2e/tools/kube "$kv" "$kldflags" \
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
  kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler

get_promtool

if [ "$bench" = 1 ]; then
  if ! command -v haproxy >/dev/null; then
    apt_install haproxy
    say "installed Debian haproxy"
  fi
  say "haproxy $(haproxy -v | awk 'NR==1 {print $3}')"
fi
say "binaries in $bin"
