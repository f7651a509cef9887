#!/usr/bin/env bash
# netbed.sh: an emulated cluster on one Linux host, built from network namespaces.
#
#   netbed.sh check                       can this host build a netbed? (root, ip, tc, a probe namespace)
#   netbed.sh up --id ID --world N [--rate RATE|none] [--ingress] [--delay D]
#                [--subnet A.B.C.0/24] [--mtu M] [--burst BYTES] [--latency T] [--owner PID]
#                [--local-size L]    two levels: L ranks per node, RATE only between nodes
#   netbed.sh down --id ID | --stale | --all
#   netbed.sh status [--id ID]
#   netbed.sh exec ID RANK CMD [ARGS...]  run CMD inside rank RANK's namespace
#   netbed.sh reap ID                     block until stdin closes, then `down --id ID`
#                                         (the Python launcher keeps one alive so that a
#                                         SIGKILLed launcher still gets its netbed removed)
#
# Topology of netbed ID with world N (nothing is created in the host's namespace):
#
#   netns dqnb-ID-r0 : lo, dqnb0 = A.B.C.1/24 --veth--+
#   netns dqnb-ID-r1 : lo, dqnb1 = A.B.C.2/24 --veth--+-- dqnbp<k> ports of bridge dqnbbr in netns dqnb-ID-br
#   ...                                                |   (bridge-nf-call-* = 0 there, STP off)
#   netns dqnb-ID-r<N-1>                  --veth------+
#
# With --local-size L, ranks L*j..L*j+L-1 are node j: a rank's packets to its node's other ranks skip
# the shaping (an htb class of their own, u32 filters on their addresses), those to other nodes go through tbf at RATE.
# Each rank's egress (dqnb<k>) is shaped by `tc tbf` at RATE; with --ingress the bridge port towards
# the rank is shaped as well, so a rank also cannot receive faster than RATE (full-duplex link).
# IPv6 is disabled in the rank namespaces, so Gloo finds exactly one (IPv4) address on dqnb<k>.
# The default subnet 198.18.0.0/24 lies in 198.18.0.0/15, which IANA reserves for benchmarking network
# devices (RFC 2544), so it collides with no real network; `up` refuses if the host routes any part of it.
#
# Everything carries the prefix "dqnb-ID-"; `down` only ever removes namespaces with that prefix (and the
# devices inside them, which vanish with them), after killing the processes still inside them (a
# leftover process keeps a deleted namespace and its veth alive). State lives in /run/dqnb/ID/.
set -euo pipefail

readonly PREFIX=dqnb
readonly STATE_ROOT=/run/dqnb
readonly BRIDGE=dqnbbr
PROG=$(basename "$0")

die() { echo "netbed: error: $*" >&2; exit 1; }
warn() { echo "netbed: warning: $*" >&2; }

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------- preconditions
need_root() {
    if [[ $EUID -ne 0 ]]; then
        die "netbed needs root: it creates network namespaces (ip netns add) and shapes links (tc)." \
            "Run it with sudo, or use the launcher's --loopback mode (unshaped ranks on 127.0.0.1, no root)."
    fi
    local cap
    cap=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
    if (( (16#$cap >> 12 & 1) == 0 || (16#$cap >> 21 & 1) == 0 )); then
        die "netbed runs as root but lacks CAP_NET_ADMIN or CAP_SYS_ADMIN (CapEff=$cap);" \
            "in a container, start it with --cap-add NET_ADMIN --cap-add SYS_ADMIN, or use --loopback."
    fi
}

need_tools() {
    local t
    for t in ip tc timeout find; do
        command -v "$t" >/dev/null || die "'$t' not found: install iproute2 (ip, tc), coreutils (timeout) and findutils."
    done
}

valid_id() {
    [[ $1 =~ ^[A-Za-z0-9_]{1,32}$ ]] || die "bad netbed id '$1': use 1-32 letters, digits or '_'."
}

ns_br() { echo "$PREFIX-$1-br"; }
ns_rank() { echo "$PREFIX-$1-r$2"; }

# Names of existing namespaces of netbed ID (rank namespaces first, bridge last).
list_ns() {
    local id=$1
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-$id-r[0-9]+\$" |
        sed -E 's/^(.*-r)([0-9]+)$/\2 \1\2/' | sort -n | cut -d' ' -f2 || true
    ip netns list 2>/dev/null | awk '{print $1}' | grep -Fx "$PREFIX-$id-br" || true
}

# Ids of every netbed present (from namespace names and state dirs).
list_ids() {
    {
        ip netns list 2>/dev/null | awk '{print $1}' | sed -n -E "s/^$PREFIX-([A-Za-z0-9_]+)-(br|r[0-9]+)\$/\1/p"
        if [[ -d $STATE_ROOT ]]; then
            find "$STATE_ROOT" -mindepth 1 -maxdepth 1 -type d -printf '%f\n'
        fi
    } | sort -u
}

# "PID STARTTIME" of a live process (start time in clock ticks since boot, field 22 of /proc/PID/stat),
# so that a recycled PID is not mistaken for the owner.
proc_identity() {
    local pid=$1 s
    s=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    s=${s##*) }
    # shellcheck disable=SC2086
    set -- $s
    echo "$pid ${20}"
}

# PIDs whose network namespace has inode INO.
pids_in_ns_inode() {
    local ino=$1
    # find fails when a listed process exits meanwhile; that is expected.
    { find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%h %l\n' 2>/dev/null || true; } |
        awk -v want="net:[$ino]" '$2 == want { split($1, f, "/"); print f[3] }'
}

ns_inode() { stat -L -c %i "/run/netns/$1" 2>/dev/null; }

# ---------------------------------------------------------------- down
# Kill every process inside the named namespaces (TERM, then KILL), then delete the namespaces.
teardown_ns() {
    local names=("$@") n ino pids=() inos=() p i
    (( ${#names[@]} )) || return 0
    for n in "${names[@]}"; do
        ino=$(ns_inode "$n") || continue
        inos+=("$ino")
        while read -r p; do [[ -n $p ]] && pids+=("$p"); done < <(pids_in_ns_inode "$ino")
    done
    if (( ${#pids[@]} )); then
        kill -TERM "${pids[@]}" 2>/dev/null || true
        for i in $(seq 1 20); do       # up to 2 s for a clean exit
            local alive=0
            for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && [[ -e /proc/$p/ns/net ]] && alive=1; done
            (( alive )) || break
            sleep 0.1
        done
        # Re-scan: a process may have forked meanwhile.
        pids=()
        for ino in "${inos[@]}"; do
            while read -r p; do [[ -n $p ]] && pids+=("$p"); done < <(pids_in_ns_inode "$ino")
        done
        if (( ${#pids[@]} )); then
            kill -KILL "${pids[@]}" 2>/dev/null || true
            for i in $(seq 1 50); do
                local left=0
                for ino in "${inos[@]}"; do [[ -n $(pids_in_ns_inode "$ino") ]] && left=1; done
                (( left )) || break
                sleep 0.1
            done
        fi
    fi
    local rc=0
    for n in "${names[@]}"; do
        ip netns del "$n" 2>/dev/null || { [[ -e /run/netns/$n ]] && { warn "could not delete namespace $n"; rc=1; }; }
    done
    for ino in "${inos[@]}"; do
        p=$(pids_in_ns_inode "$ino" | tr '\n' ' ')
        if [[ -n $p ]]; then warn "processes $p survived SIGKILL and keep a deleted namespace alive"; rc=1; fi
    done
    return $rc
}

down_id() {
    local id=$1 names=()
    mapfile -t names < <(list_ns "$id")
    local rc=0
    teardown_ns "${names[@]}" || rc=1
    rm -rf "${STATE_ROOT:?}/$id"
    return $rc
}

cmd_down() {
    local id="" mode=""
    while (( $# )); do
        case $1 in
            --id) id=$2; mode=id; shift 2 ;;
            --all) mode=all; shift ;;
            --stale) mode=stale; shift ;;
            *) die "down: unknown argument '$1' (want --id ID, --stale or --all)" ;;
        esac
    done
    [[ -n $mode ]] || die "down: say which netbed: --id ID, --stale (owner gone) or --all (every $PREFIX-* netbed)"
    need_root
    local rc=0 x
    case $mode in
        id) valid_id "$id"; down_id "$id" || rc=1 ;;
        all) for x in $(list_ids); do down_id "$x" || rc=1; done ;;
        stale)
            for x in $(list_ids); do
                local owner="" now=""
                [[ -f $STATE_ROOT/$x/owner ]] && owner=$(<"$STATE_ROOT/$x/owner")
                if [[ -z $owner ]]; then
                    # No owner recorded: an `up` that is just starting (state younger than a minute: leave
                    # it), or an orphan whose state was lost or never finished.
                    if [[ -d $STATE_ROOT/$x ]] && [[ -n $(find "$STATE_ROOT/$x" -maxdepth 0 -newermt '-60 seconds') ]]; then
                        continue
                    fi
                    echo "netbed: removing $x (no owner recorded)" >&2
                    down_id "$x" || rc=1
                    continue
                fi
                [[ $owner == none ]] && continue
                now=$(proc_identity "${owner%% *}" || true)
                if [[ $now != "$owner" ]]; then
                    echo "netbed: removing $x (owner ${owner%% *} is gone)" >&2
                    down_id "$x" || rc=1
                fi
            done ;;
    esac
    return $rc
}

# ---------------------------------------------------------------- up
ip2int() {
    local IFS=. a b c d
    read -r a b c d <<<"$1"
    echo $(( (a << 24) | (b << 16) | (c << 8) | d ))
}

# Refuse a subnet that overlaps any IPv4 route or address of the host (all routing tables).
check_subnet_free() {
    local base=$1 net line pfx len r m
    local -
    set -f
    net=$(ip2int "$base")
    while read -r line; do
        set -- $line
        case ${1:-} in
            local|broadcast|unicast|multicast|anycast|unreachable|blackhole|prohibit|throw|nat) shift ;;
        esac
        pfx=${1:-}
        [[ -z $pfx || $pfx == default ]] && continue
        [[ $pfx =~ ^[0-9]+(\.[0-9]+){3}(/[0-9]+)?$ ]] || continue
        if [[ $pfx == */* ]]; then len=${pfx#*/}; pfx=${pfx%/*}; else len=32; fi
        r=$(ip2int "$pfx")
        m=$(( len < 24 ? len : 24 ))
        (( m == 0 )) && continue
        local mask=$(( (0xffffffff << (32 - m)) & 0xffffffff ))
        if (( (r & mask) == (net & mask) )); then
            die "subnet $base/24 overlaps the host's route '$line'; pick another with --subnet (e.g. 198.19.0.0/24)"
        fi
    done < <(ip -4 route show table all 2>/dev/null; ip -4 -o addr show 2>/dev/null | awk '{print $4}')
}

# Rate in bit/s from tc-style text (1gbit, 100mbit, 2500000000bit, 1000000000).
rate_bps() {
    local r=${1,,}
    if [[ $r =~ ^([0-9]+)(bit|kbit|mbit|gbit|tbit)?$ ]]; then
        local n=${BASH_REMATCH[1]} u=${BASH_REMATCH[2]:-bit}
        case $u in
            bit) echo "$n" ;; kbit) echo $(( n * 1000 )) ;; mbit) echo $(( n * 1000000 )) ;;
            gbit) echo $(( n * 1000000000 )) ;; tbit) echo $(( n * 1000000000000 )) ;;
        esac
    else
        return 1
    fi
}

# netem probe inside an existing namespace of ours (never the host's): 0 if a `netem` qdisc can be made.
netem_supported() {
    local ns=$1 out
    ip -n "$ns" link add dqnbprb0 type veth peer name dqnbprb1 2>/dev/null || return 1
    if out=$(tc -n "$ns" qdisc add dev dqnbprb0 root netem delay 1ms 2>&1); then
        ip -n "$ns" link del dqnbprb0
        return 0
    fi
    ip -n "$ns" link del dqnbprb0 2>/dev/null || true
    NETEM_ERROR=$out
    return 1
}

UP_ID=""
up_cleanup() {
    local rc=$?
    if [[ -n $UP_ID && $rc -ne 0 ]]; then
        echo "netbed: up failed (status $rc); removing the partial netbed $UP_ID" >&2
        down_id "$UP_ID" || true
    fi
}

shape() {   # shape NS DEV [K]: root tbf (and netem delay under it); K: rank K of a two-level layout
    local ns=$1 dev=$2 k=${3:-}
    if [[ -n $k && $LOCAL_SIZE -gt 0 && $RATE != none ]]; then
        # Two levels (--local-size L): ranks L*j .. L*j+L-1 form node j. An htb root sends packets to
        # the node's other ranks to class 1:10 (100 gbit: unshaped, the bare veth is slower) and
        # everything else to class 1:30, whose tbf shapes at RATE as on a one-level netbed: the link
        # between nodes is shaped, the one inside a node is not. (This kernel has no prio qdisc.)
        local node=$(( k / LOCAL_SIZE )) j
        tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 30
        tc -n "$ns" class add dev "$dev" parent 1: classid 1:10 htb rate 100gbit quantum 65536
        tc -n "$ns" class add dev "$dev" parent 1: classid 1:30 htb rate 100gbit quantum 65536
        tc -n "$ns" qdisc add dev "$dev" parent 1:30 handle 30: tbf rate "${RATE_BPS}bit" burst "$BURST" latency "$LATENCY"
        for (( j = node * LOCAL_SIZE; j < (node + 1) * LOCAL_SIZE; j++ )); do
            (( j == k )) && continue
            tc -n "$ns" filter add dev "$dev" parent 1: protocol ip prio 1 u32 match ip dst "$STEM.$(( j + 1 ))/32" flowid 1:10
        done
        return
    fi
    if [[ $RATE != none ]]; then
        tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "${RATE_BPS}bit" burst "$BURST" latency "$LATENCY"
        if [[ -n $DELAY ]]; then
            tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$DELAY" limit 100000
        fi
    elif [[ -n $DELAY ]]; then
        tc -n "$ns" qdisc add dev "$dev" root handle 10: netem delay "$DELAY" limit 100000
    fi
}

cmd_up() {
    local id="" world="" subnet=198.18.0.0/24 mtu=1500 owner="" ingress=0
    RATE=1gbit; DELAY=""; BURST=""; LATENCY=20ms; LOCAL_SIZE=0
    while (( $# )); do
        case $1 in
            --id) id=$2; shift 2 ;;
            --local-size) LOCAL_SIZE=$2; shift 2 ;;
            --world) world=$2; shift 2 ;;
            --rate) RATE=$2; shift 2 ;;
            --ingress) ingress=1; shift ;;
            --delay) DELAY=$2; shift 2 ;;
            --subnet) subnet=$2; shift 2 ;;
            --mtu) mtu=$2; shift 2 ;;
            --burst) BURST=$2; shift 2 ;;
            --latency) LATENCY=$2; shift 2 ;;
            --owner) owner=$2; shift 2 ;;
            *) die "up: unknown argument '$1'" ;;
        esac
    done
    [[ -n $id ]] || die "up: --id ID is required (the launcher uses PID_SEQ)"
    valid_id "$id"
    [[ $world =~ ^[0-9]+$ ]] && (( world >= 1 && world <= 253 )) || die "up: --world must be 1..253, got '$world'"
    [[ $mtu =~ ^[0-9]+$ ]] && (( mtu >= 576 && mtu <= 65535 )) || die "up: --mtu must be 576..65535, got '$mtu'"
    if [[ ${RATE,,} == none || ${RATE,,} == unshaped ]]; then
        RATE=none
    else
        RATE_BPS=$(rate_bps "$RATE") || die "up: bad --rate '$RATE' (examples: 100mbit, 1gbit, 10gbit, 2500000000bit, none)"
        (( RATE_BPS >= 1000000 )) || die "up: --rate below 1 mbit is not useful here"
        # tbf must hold one 64 KB GSO segment in its bucket; at high rates allow ~1 ms of line rate.
        if [[ -z $BURST ]]; then
            BURST=$(( RATE_BPS / 8 / 1000 )); (( BURST < 131072 )) && BURST=131072
        fi
    fi
    [[ $subnet =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)\.0(/24)?$ ]] || die "up: --subnet must be A.B.C.0/24, got '$subnet'"
    local base=${subnet%/24}
    local stem=${base%.0}
    STEM=$stem
    [[ $LOCAL_SIZE =~ ^[0-9]+$ ]] && (( LOCAL_SIZE == 0 || world % LOCAL_SIZE == 0 )) \
        || die "up: --local-size must divide --world ($world), got '$LOCAL_SIZE'"
    [[ $LOCAL_SIZE -eq 0 || ( -z $DELAY && $ingress -eq 0 ) ]] || die "up: --local-size does not combine with --delay or --ingress"

    need_root
    need_tools
    check_subnet_free "$base"
    [[ -z $(list_ns "$id") && ! -e $STATE_ROOT/$id ]] || die "netbed '$id' already exists (see '$PROG status'; remove it with '$PROG down --id $id')"

    UP_ID=$id
    trap up_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    local state=$STATE_ROOT/$id
    mkdir -p "$state"
    if [[ -n $owner ]]; then
        proc_identity "$owner" >"$state/owner" || die "up: --owner $owner is not a running process"
    else
        echo none >"$state/owner"
    fi
    printf '%s\n' "$world" >"$state/world"
    printf '%s\n' "$RATE${RATE_BPS:+ $RATE_BPS}" >"$state/rate"
    printf '%s\n' "$base/24" >"$state/subnet"
    printf '%s\n' "$LOCAL_SIZE" >"$state/local_size"

    local br k ns
    br=$(ns_br "$id")
    ip netns add "$br"
    if [[ -n $DELAY ]] && ! netem_supported "$br"; then
        die "--delay $DELAY needs the netem qdisc, which this kernel lacks (tc: ${NETEM_ERROR:-netem probe failed})." \
            "Delay cannot be emulated here; run without --delay."
    fi
    ip -n "$br" link set lo up
    ip -n "$br" link add "$BRIDGE" type bridge stp_state 0 forward_delay 0
    # Bridged frames must not traverse iptables (the host's br_netfilter defaults these to 1 in new namespaces).
    ip netns exec "$br" sh -c 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ -e "$f" ] && echo 0 > "$f"; done; true'
    ip -n "$br" link set "$BRIDGE" mtu "$mtu" up

    for (( k = 0; k < world; k++ )); do
        ns=$(ns_rank "$id" "$k")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null || true
        ip -n "$br" link add "dqnbp$k" mtu "$mtu" type veth peer name "dqnb$k" mtu "$mtu" netns "$ns"
        ip -n "$br" link set "dqnbp$k" master "$BRIDGE" up
        ip -n "$ns" addr add "$stem.$(( k + 1 ))/24" dev "dqnb$k"
        ip -n "$ns" link set "dqnb$k" up
        shape "$ns" "dqnb$k" "$k"
        (( ingress )) && shape "$br" "dqnbp$k"
    done

    for (( k = 0; k < world; k++ )); do
        echo "rank $k $(ns_rank "$id" "$k") dqnb$k $stem.$(( k + 1 ))"
    done
    trap - EXIT INT TERM
}

# ---------------------------------------------------------------- status / exec / reap / check
cmd_status() {
    local only=""
    [[ ${1:-} == --id ]] && { only=$2; valid_id "$only"; }
    local ids x n any=0
    ids=$(list_ids)
    for x in $ids; do
        [[ -n $only && $x != "$only" ]] && continue
        any=1
        local owner="?" rate="?" world="?" alive=""
        [[ -f $STATE_ROOT/$x/owner ]] && owner=$(<"$STATE_ROOT/$x/owner")
        [[ -f $STATE_ROOT/$x/rate ]] && rate=$(<"$STATE_ROOT/$x/rate")
        [[ -f $STATE_ROOT/$x/world ]] && world=$(<"$STATE_ROOT/$x/world")
        if [[ $owner != none && $owner != "?" ]]; then
            [[ $(proc_identity "${owner%% *}" || true) == "$owner" ]] && alive=" (alive)" || alive=" (gone: stale)"
        fi
        echo "netbed $x: world $world, rate ${rate%% *}, owner ${owner%% *}$alive"
        for n in $(list_ns "$x"); do
            local ino np=0 addr="" q=""
            ino=$(ns_inode "$n" || true)
            if [[ -n $ino ]]; then np=$(pids_in_ns_inode "$ino" | wc -l); fi
            if [[ $n == *-br ]]; then
                echo "  $n: bridge $BRIDGE, $np processes"
            else
                local dev=dqnb${n##*-r}
                addr=$(ip -n "$n" -4 -o addr show dev "$dev" 2>/dev/null | awk '{print $4}' || true)
                q=$(tc -s -n "$n" qdisc show dev "$dev" 2>/dev/null | awk '/^qdisc/ {k=$2} /Sent/ {d = $7; sub(",", "", d); printf "%s sent %s B dropped %s ", k, $2, d}' || true)
                echo "  $n: $dev $addr, $np processes, ${q:-no qdisc}"
            fi
        done
    done
    (( any )) || echo "no netbed (nothing named $PREFIX-*)"
}

cmd_exec() {
    (( $# >= 3 )) || die "exec: usage: $PROG exec ID RANK CMD [ARGS...]"
    local id=$1 rank=$2; shift 2
    valid_id "$id"
    need_root
    exec ip netns exec "$(ns_rank "$id" "$rank")" "$@"
}

cmd_reap() {
    local id=${1:-}
    valid_id "$id"
    # Blocks until the launcher closes our stdin, deliberately or by dying.
    cat >/dev/null || true
    down_id "$id"
}

CHECK_ID=""
cmd_check() {
    need_root
    need_tools
    CHECK_ID="chk$$"
    local rc=0 out ns
    ns=$(ns_rank "$CHECK_ID" 0)
    mkdir -p "$STATE_ROOT/$CHECK_ID"; echo none >"$STATE_ROOT/$CHECK_ID/owner"
    trap 'down_id "$CHECK_ID" >/dev/null 2>&1 || true' EXIT
    if ! out=$(ip netns add "$ns" 2>&1); then
        echo "netbed: cannot create a network namespace: $out" >&2; rc=1
    elif ! out=$({ ip -n "$ns" link add dqnbc0 type veth peer name dqnbc1 &&
                   tc -n "$ns" qdisc add dev dqnbc0 root tbf rate 1gbit burst 131072 latency 20ms; } 2>&1); then
        echo "netbed: veth or tc tbf unavailable: $out" >&2; rc=1
    else
        local netem=yes
        netem_supported "$ns" || netem="no ($NETEM_ERROR)"
        echo "netbed: ok (namespaces, veth, tbf; netem delay: $netem)"
    fi
    return $rc
}

main() {
    local cmd=${1:-}
    (( $# )) && shift
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        status) need_root; cmd_status "$@" ;;
        exec) cmd_exec "$@" ;;
        reap) need_root; cmd_reap "$@" ;;
        check) cmd_check ;;
        -h|--help|help|"") usage ;;
        *) usage >&2; die "unknown command '$cmd'" ;;
    esac
}

main "$@"
