#!/usr/bin/env bash
# Run a command inside a throwaway qemu VM that has a real Soft-RoCE (rdma_rxe) device, or in
# two such VMs joined by a virtual Ethernet link.
#
#   testbed/vm.sh [--provider rxe|siw] [--timeout SECONDS] [--mem MB] -- COMMAND [ARGS...]
#   testbed/vm.sh --pair [--timeout SECONDS] [--mem MB] -- COMMAND [ARGS...]
#   testbed/vm.sh --prepare
#
# The host kernel has no RDMA, so we boot the stock Debian kernel (which ships rdma_rxe as a
# module) under TCG, share the host's / read-only over 9p and chroot into it: every host tool,
# library and freshly built test binary is available unchanged. Inside the VM the command runs
# in the caller's working directory with rxe0 on top of dummy netdev rd0 (10.77.0.1, fd77::1),
# exported as RDMA_TEST_ADDR / RDMA_TEST_ADDR6 (RDMA_TEST_SILENT_ADDR=10.77.0.2 answers nobody).
# The netdev's MTU is 9000 (jumbo frames, as RoCE fabrics run), so rxe0's active MTU is 4096.
# Its stdout+stderr stream to our stdout. The VM's /tmp is the host's with writes kept in RAM
# (discarded); the rest of / is read-only; ulimit -l is unlimited; the environment is only
# HOME=/tmp, PATH, LANG and the RDMA_TEST_* variables.
# Exit status: the command's; 124 timeout; 125 test bed failure (no boot, no rxe0).
#
# --provider siw (or RDMA_TESTBED_PROVIDER=siw) puts soft-iWARP's siw0 on rd0 instead of rxe0,
# and exports RDMA_TEST_PROVIDER=siw (rxe otherwise). Debian's kernels do not ship siw: --prepare
# builds the module out of tree from the kernel's own Debian source and headers (extracted into
# the cache, nothing installed) and puts it in the initramfs beside rxe.
#
# --pair boots two such VMs, one vCPU each (the machine may have only two cores), --mem MB each
# (default 2048), joined by a virtio NIC eth0 whose frames travel as UDP datagrams over the
# host's loopback (qemu -netdev dgram; stream sockets would add Nagle's ~40 ms delays). rxe0
# sits on eth0. The SAME command runs in both, in the caller's working directory:
#   host a: RDMA_TEST_ROLE=driver RDMA_TEST_ADDR=10.78.0.1 RDMA_TEST_PEER_ADDR=10.78.0.2
#           RDMA_TEST_ADDR6=fd78::1 RDMA_TEST_PEER_ADDR6=fd78::2 RDMA_TEST_SILENT_ADDR=10.78.0.3
#           RDMA_TEST_CONTROL=/run/testbed/control (a folder the harness watches, see below)
#   host b: RDMA_TEST_ROLE=agent RDMA_TEST_ADDR=10.78.0.2 RDMA_TEST_PEER_ADDR=10.78.0.1
#           RDMA_TEST_ADDR6=fd78::2 RDMA_TEST_PEER_ADDR6=fd78::1 RDMA_TEST_SILENT_ADDR=10.78.0.3
# b boots a second after a, and a's command is not held back for it: it may wait for
# peer-started (below), and must retry reaching b's server anyway (a client that dials before
# the server listens is rejected). a's output streams live to our stdout. b powers off when its
# own command ends; when a's ends, b is killed whatever it is doing, and b's output follows on
# stderr, each line prefixed "[b] ". Exit status: a's command's; 124 when a timed out; 125 when
# either VM failed as a test bed (no boot, no rxe0, or b's VM went down without finishing).
# Control files in $RDMA_TEST_CONTROL, polled by the host every 0.2 s (the job share is 9p
# without a cache, so a's next lookup sees what the host created):
#   peer-started  the harness creates it once b's command has started (rxe0 up on b).
#   kill-peer     a's command creates it to make host b vanish without a goodbye: the harness
#                 SIGKILLs b's qemu (no FIN, no disconnect, no more frames), then creates
#   peer-killed   once b's qemu is gone. b is not restarted.
# Fault injection on the link is done from inside, e.g. tc qdisc add dev eth0 root netem loss 5%.
#
# Environment: RDMA_TESTBED_CACHE (kernel/initramfs cache), RDMA_TESTBED_VERBOSE=1 (timings).
# Requires root (apt-get, qemu's 9p as root).
set -euo pipefail

timeout_s=900
mem_mb='' # default: 3072, or 2048 per VM with --pair
prepare='' # --prepare: install packages and build the kernel cache, run nothing
pair=''
provider=${RDMA_TESTBED_PROVIDER:-rxe}
usage() {
	echo "usage: $0 [--pair] [--provider rxe|siw] [--timeout SECONDS] [--mem MB] -- COMMAND [ARGS...] | $0 --prepare" >&2
	exit 2
}
while (($#)); do
	case $1 in
	--timeout) (($# >= 2)) || usage; timeout_s=$2; shift 2 ;;
	--mem) (($# >= 2)) || usage; mem_mb=$2; shift 2 ;;
	--pair) pair=1; shift ;;
	--provider) (($# >= 2)) || usage; provider=$2; shift 2 ;;
	--prepare) prepare=1; shift ;;
	--) shift; break ;;
	*) usage ;;
	esac
done
(($# || prepare)) || usage
mem_mb=${mem_mb:-$([[ -n $pair ]] && echo 2048 || echo 3072)}
[[ $timeout_s =~ ^[0-9]+$ && $mem_mb =~ ^[0-9]+$ && $provider =~ ^(rxe|siw)$ ]] || usage
[[ -z $pair || $provider == rxe ]] || { echo "testbed: --pair runs on rxe only" >&2; exit 2; }

cache=${RDMA_TESTBED_CACHE:-/var/cache/goverbs-testbed}
packages=(qemu-system-x86 busybox-static kmod cpio rdma-core ibverbs-providers ibverbs-utils
	libibverbs-dev librdmacm-dev rdmacm-utils perftest iproute2 xz-utils gcc-12 make)
# Module trees (under lib/modules/VER/kernel) that rxe, 9p, virtio and dummy need, with their
# dependencies (not the hardware RDMA drivers: a smaller initramfs unpacks faster under TCG);
# overlayfs gives the VM a writable /tmp that still shows the host's /tmp; virtio_net joins the
# --pair hosts, and net/sched lets a test inject faults on that link (tc ... netem).
module_trees=(drivers/infiniband/core drivers/infiniband/sw/rxe net/ipv4/udp_tunnel.ko
	net/ipv6/ip6_udp_tunnel.ko crypto arch/x86/crypto fs/9p net/9p fs/netfs fs/fscache
	drivers/virtio drivers/net/dummy.ko drivers/net/veth.ko fs/configfs fs/overlayfs lib
	drivers/net/virtio_net.ko drivers/net/net_failover.ko net/core/failover.ko net/sched)

# The VM's /init. It is the same for every job (the job comes in through the "job" 9p share,
# mounted at /run/testbed inside the chroot), so the initramfs is built once per kernel.
read -r -d '' init_script <<'EOF' || true
#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /sbin /usr/bin /usr/sbin /host /upper
# Links for every applet; /sbin/modprobe is also what the kernel calls to autoload crypto.
/bin/busybox --install -s
mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc && mount -t sysfs sys /sys && dmesg -n 1
# testbed.host=N (vm.sh --pair): host N of two joined by a virtio NIC. The kernel keeps dotted
# parameters to itself (they name module options), so read it back from the command line.
# testbed.provider=siw: soft-iWARP instead of Soft-RoCE.
host= provider=rxe
for a in $(cat /proc/cmdline); do
	case $a in testbed.host=[0-9]*) host=${a#*=} ;; testbed.provider=siw) provider=siw ;; esac
done
rdmamod=rdma_rxe && [ "$provider" = rxe ] || rdmamod=siw
# ib_uverbs before rdma_cm: a device delete takes its clients off in the reverse order they
# registered, and ib_uverbs waits there until every process has closed the device, which a
# process does when rdma_cm tells it of the removal, so rdma_cm must be told first. rdma_rxe
# pulls ib_uverbs in before itself; siw does not, and rdma_ucm would load rdma_cm first.
mods="virtio_pci 9pnet_virtio 9p overlay ib_uverbs $rdmamod rdma_ucm dummy"
[ -z "$host" ] || mods="$mods virtio_net sch_netem"
for m in $mods; do
	modprobe "$m" $([ "$m" = dummy ] && echo numdummies=0) || echo "testbed: modprobe $m failed"
done
o=trans=virtio,version=9p2000.L,msize=262144
# cache=loose: uncached 9p makes every exec from the host crawl (~2 s per tool under TCG).
mount -t 9p -o "$o,ro,cache=loose" hostroot /host || { echo "testbed: cannot mount host /"; poweroff -f; }
mount -t proc proc /host/proc && mount -t sysfs sys /host/sys && mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/pts /host/dev/shm && mount -t devpts devpts /host/dev/pts && mount -t tmpfs shm /host/dev/shm
# The 9p root is read-only: /run is a tmpfs; /tmp is the host's /tmp (a job may live there)
# with a tmpfs overlaid for writes, or a plain tmpfs if overlayfs refuses.
mount -t tmpfs tmpfs /host/run && mount -t tmpfs tmpfs /upper && mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/host/tmp,upperdir=/upper/u,workdir=/upper/w /host/tmp ||
	mount -t tmpfs tmpfs /host/tmp
chmod 1777 /host/tmp /upper/u
J=/host/run/testbed && mkdir -p "$J"
mount -t 9p -o "$o" job "$J" || { echo "testbed: cannot mount job share"; poweroff -f; }
# busybox ip (already in memory) is faster than the host's; no DAD, as with "nodad".
echo 0 >/proc/sys/net/ipv6/conf/default/accept_dad
# One SYN retry (TCP gives up after 3 s, not 127 s): on siw a Dial to a silent address leaves
# rdma_connect, which connects TCP, running past the Dial's deadline, and a test waits for it
# (6.5 s in all).
echo 1 >/proc/sys/net/ipv4/tcp_syn_retries
ip link set lo up
if [ -n "$host" ]; then
	# eth0 appeared with virtio_net, before the default above: it needs its own no-DAD.
	dev=eth0 && echo 0 >/proc/sys/net/ipv6/conf/eth0/accept_dad
	ip link set eth0 mtu 9000 && ip link set eth0 up
	ip addr add "10.78.0.$host/24" dev eth0 && ip addr add "fd78::$host/64" dev eth0
else
	dev=rd0 && ip link add rd0 type dummy && ip link set rd0 mtu 9000 && ip link set rd0 up
	ip addr add 10.77.0.1/24 dev rd0 && ip addr add fd77::1/64 dev rd0
fi
H="chroot /host /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin"
if $H rdma link add "${provider}0" type "$provider" netdev "$dev" >>"$J/output" 2>&1; then
	echo "job start: uptime $(cat /proc/uptime)"
	: >"$J/started" # tells the --pair harness that this host's command runs
	# env -i: the job sees only what run.sh exports, not the kernel's init environment.
	$H bash /run/testbed/run.sh </dev/null >>"$J/output" 2>&1
	echo $? >"$J/status.tmp" && mv "$J/status.tmp" "$J/status"
else
	echo "testbed: ${provider}0 could not be created" >"$J/error"
fi
sync
poweroff -f
EOF

# 1. Host packages (the chroot reuses them, so they matter inside the VM too).
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "testbed: installing ${missing[*]}" >&2
	apt-get update -q >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
fi

# 2. Kernel and initramfs, cached; the lock keeps concurrent runs from building twice.
# The module directory's name is the version (what uname -r reports and depmod wants); newer
# Debian kernels ship it under usr/lib/modules.
modules_dir() {
	local d
	for d in "$1"/lib/modules/*/ "$1"/usr/lib/modules/*/; do
		[[ -d $d ]] && { echo "${d%/}"; return; }
	done
}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
kdir=$(printf '%s\n' "$cache"/kernel-*/ | grep -v '\*' | sort -V | tail -n 1) || true
if [[ -z $kdir ]]; then
	find_image() { apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {print $2; exit}'; }
	pkg=$(find_image)
	if [[ -z $pkg ]]; then # package lists never fetched on this machine
		apt-get update -q >&2
		pkg=$(find_image)
	fi
	[[ -n $pkg ]] || { echo "testbed: cannot find the linux-image-amd64 dependency" >&2; exit 125; }
	if ! compgen -G "$cache/${pkg}_*.deb" >/dev/null; then
		echo "testbed: downloading $pkg" >&2
		# Sandbox user root: the _apt user could not write the root-owned cache.
		(cd "$cache" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2)
	fi
	deb=$(printf '%s\n' "$cache/${pkg}_"*.deb | sort -V | tail -n 1)
	# Extract beside the cache, rename when done: a half-extracted tree is never used.
	tmp=$(mktemp -d "$cache/.extract.XXXXXX")
	dpkg-deb -x "$deb" "$tmp"
	src=$(modules_dir "$tmp") || { echo "testbed: no lib/modules in $deb" >&2; exit 125; }
	ver=${src##*/}
	mv "$tmp" "$cache/kernel-$ver"
	kdir=$cache/kernel-$ver/
fi
kdir=${kdir%/}
src=$(modules_dir "$kdir") || true
ver=${src##*/}
vmlinuz=$kdir/boot/vmlinuz-$ver
initrd=$cache/initrd-$ver.gz
[[ -n $ver && -f $vmlinuz ]] || { echo "testbed: broken kernel cache $kdir" >&2; exit 125; }
# Boot the uncompressed ELF through qemu's PVH entry when the kernel has one: the bzImage's own
# xz decompression takes ~5 s under TCG. Any doubt (no PVH, not xz, not ELF): the bzImage.
kernel=$vmlinuz
if [[ ! -f $kdir/vmlinux ]] && grep -q '^CONFIG_PVH=y' "$kdir/boot/config-$ver" 2>/dev/null; then
	off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$vmlinuz" | head -n 1 | cut -d: -f1) || true
	if [[ -n $off ]] && xz -dc --single-stream <(tail -c +"$((off + 1))" "$vmlinuz") >"$kdir/vmlinux.tmp" 2>/dev/null &&
		[[ $(head -c 4 "$kdir/vmlinux.tmp") == $'\x7fELF' ]]; then
		mv "$kdir/vmlinux.tmp" "$kdir/vmlinux"
	fi
	rm -f "$kdir/vmlinux.tmp"
fi
[[ ! -f $kdir/vmlinux ]] || kernel=$kdir/vmlinux
# soft-iWARP: Debian builds its kernels without CONFIG_RDMA_SIW, so siw.ko is built here from the
# same kernel's source package against its headers package (both extracted under the cache,
# nothing installed; ~15 s of compiling once per kernel).
siw=$cache/siw-$ver.ko
if [[ ! -f $siw ]]; then
	echo "testbed: building siw.ko for $ver" >&2
	series=$(echo "$ver" | cut -d. -f1,2) # 6.1.0-56-amd64: linux-source-6.1
	tmp=$(mktemp -d "$cache/.siw.XXXXXX")
	(cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "linux-source-$series" "linux-headers-$ver" \
		"linux-headers-${ver%-*}-common" "linux-kbuild-$series" >&2) ||
		{ echo "testbed: cannot download the kernel source and headers for siw" >&2; exit 125; }
	for d in "$tmp"/linux-headers-*.deb "$tmp"/linux-kbuild-*.deb; do dpkg-deb -x "$d" "$tmp/root"; done
	dpkg-deb --fsys-tarfile "$tmp"/linux-source-*.deb | tar -x -C "$tmp" --wildcards './usr/src/linux-source-*.tar.xz'
	tar -xf "$tmp"/usr/src/linux-source-*.tar.xz -C "$tmp" --wildcards 'linux-source-*/drivers/infiniband/sw/siw'
	# The headers' Makefile includes the common tree by its installed (absolute) path.
	sed -i "s|/usr/src/|$tmp/root/usr/src/|" "$tmp/root/usr/src/linux-headers-$ver/Makefile"
	m=$(echo "$tmp"/linux-source-*/drivers/infiniband/sw/siw)
	make -s -C "$tmp/root/usr/src/linux-headers-$ver" M="$m" CONFIG_RDMA_SIW=m CC=gcc-12 modules >&2 ||
		{ echo "testbed: building siw.ko failed" >&2; exit 125; }
	mv "$m/siw.ko" "$siw"
	rm -rf "$tmp"
fi
hash=$(printf '%s\n' "$init_script" "$ver" "${module_trees[@]}" "$(sha256sum <"$siw")" | sha256sum | cut -d' ' -f1)
if [[ ! -f $initrd || $(cat "$initrd.sha256" 2>/dev/null) != "$hash" ]]; then
	echo "testbed: building $initrd" >&2
	root=$(mktemp -d)
	dst=$root/lib/modules/$ver
	mkdir -p "$root/bin" "$dst/kernel"
	cp /bin/busybox "$root/bin/busybox"
	printf '%s\n' "$init_script" >"$root/init"
	chmod 755 "$root/init"
	cp "$src"/modules.builtin* "$src/modules.order" "$dst/"
	for t in "${module_trees[@]}"; do
		[[ -e $src/kernel/$t ]] || continue # e.g. fs/fscache is gone in newer kernels
		mkdir -p "$(dirname "$dst/kernel/$t")"
		cp -a "$src/kernel/$t" "$dst/kernel/$t"
	done
	mkdir -p "$dst/kernel/drivers/infiniband/sw/siw" && cp "$siw" "$dst/kernel/drivers/infiniband/sw/siw/"
	depmod -b "$root" "$ver"
	(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -6 >"$initrd.tmp"
	rm -rf "$root"
	mv "$initrd.tmp" "$initrd"
	echo "$hash" >"$initrd.sha256"
fi
exec 9>&- # unlocks; qemu need not inherit it
[[ -z $prepare ]] || exit 0

# 3. The job: run.sh runs in the chroot under bash, so printf %q quoting round-trips exactly.
# write_job DIR EXPORTS COMMAND...
write_job() {
	local dir=$1 exports=$2
	shift 2
	mkdir -p "$dir"
	{
		echo 'ulimit -l unlimited'
		printf 'export HOME=/tmp PATH=%q LANG=C.UTF-8\n' "$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
		echo "export $exports"
		printf 'cd -- %q || exit 125\n' "$PWD"
		printf 'exec'; printf ' %q' "$@"; echo
	} >"$dir/run.sh"
	: >"$dir/output"
}

# Under TCG the kernel does not trust the TSC and picks the emulated HPET, so every clock read
# (Go's scheduler and timers, time.Now) becomes a system call plus an emulated device access,
# ~10 µs each; real hosts read the TSC in user space. The TSC qemu emulates is derived from
# the host clock and consistent across vCPUs, so the guest is told to use it.
append='console=ttyS0 quiet panic=-1 clocksource=tsc tsc=reliable'
# shellcheck disable=SC2054 # the commas belong to qemu's option syntax
qemu=(qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$mem_mb" -kernel "$kernel" -initrd "$initrd"
	-nographic -no-reboot -nic none
	-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap)

# vm_failed DIR NAME: explains why the VM whose job folder is DIR left no exit status.
vm_failed() {
	if [[ -f $1/error ]]; then
		echo "testbed: $2: $(sed 's/^testbed: //' "$1/error")" >&2
	else
		echo "testbed: last lines of the $2 console:" >&2
		tail -n 30 "$1/console.log" | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' >&2
		echo "testbed: $2 did not boot or its job did not finish (no exit status)" >&2
	fi
}

job=$(mktemp -d /tmp/rdma-testbed.XXXXXX)
qpid='' tpid='' bpid=''
# stop_b: host b's qemu dies at once: it has nothing to save, and a kill-peer must be abrupt.
# qemu's own pid (not timeout's, which cannot pass on a KILL) is taken only while its timeout
# still runs, i.e. before anyone has reaped it.
stop_b() {
	local pid=''
	[[ -n $bpid ]] || return 0
	if kill -0 "$bpid" 2>/dev/null; then
		pid=$(cat "$job/b.pid" 2>/dev/null) || true
		if [[ $pid =~ ^[0-9]+$ ]]; then
			kill -KILL "$pid" 2>/dev/null || true
		else # so early that qemu has not written its pid yet
			kill -TERM "$bpid" 2>/dev/null || true
		fi
	fi
	wait "$bpid" 2>/dev/null || true
	bpid=
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	stop_b
	[[ -z $qpid ]] || kill "$qpid" 2>/dev/null || true
	[[ -z $tpid ]] || kill "$tpid" 2>/dev/null || true
	rm -rf "$job"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 4. Boot. The serial console goes to a log (shown only on failure); the job's output file is
# followed live. timeout(1) returns 124 itself when it has to kill qemu.
start=$SECONDS
if [[ -z $pair ]]; then
	write_job "$job" "RDMA_TEST_PROVIDER=$provider RDMA_TEST_ADDR=10.77.0.1 RDMA_TEST_ADDR6=fd77::1 RDMA_TEST_SILENT_ADDR=10.77.0.2" "$@"
	timeout -k 10 "$timeout_s" "${qemu[@]}" -smp 2 -append "$append testbed.provider=$provider" \
		-virtfs "local,path=$job,mount_tag=job,security_model=none" \
		</dev/null >"$job/console.log" 2>&1 &
	qpid=$!
	tail -s 0.2 -n +1 -f --pid="$qpid" "$job/output" &
	tpid=$!
	rc=0
	wait "$qpid" || rc=$?
	qpid=
	wait "$tpid" || true
	tpid=
	if ((rc == 124 || rc == 137)); then # 137: qemu ignored TERM and needed timeout's KILL
		echo "testbed: VM timed out after $timeout_s s" >&2
		exit 124
	elif [[ ! -f $job/status ]]; then
		vm_failed "$job" VM
		exit 125
	fi
	[[ -z ${RDMA_TESTBED_VERBOSE:-} ]] ||
		echo "testbed: VM ran $((SECONDS - start)) s; $(grep -o 'job start: uptime [0-9.]*' "$job/console.log")" >&2
	exit "$(cat "$job/status")"
fi

# --pair. Two UDP ports that nothing on the host uses, below the ephemeral range so that no
# outgoing socket takes one meanwhile.
used=" $(ss -Hanu 2>/dev/null | awk '{sub(/.*:/, "", $4); printf "%s ", $4}') "
ports=()
while ((${#ports[@]} < 2)); do
	p=$((20000 + RANDOM % 12000))
	[[ $used == *" $p "* || ${ports[*]-} == *"$p"* ]] || ports+=("$p")
done
a=$job/a b=$job/b ctl=$job/a/control
write_job "$a" 'RDMA_TEST_PROVIDER=rxe RDMA_TEST_ROLE=driver RDMA_TEST_ADDR=10.78.0.1 RDMA_TEST_PEER_ADDR=10.78.0.2 RDMA_TEST_ADDR6=fd78::1 RDMA_TEST_PEER_ADDR6=fd78::2 RDMA_TEST_SILENT_ADDR=10.78.0.3 RDMA_TEST_CONTROL=/run/testbed/control' "$@"
write_job "$b" 'RDMA_TEST_PROVIDER=rxe RDMA_TEST_ROLE=agent RDMA_TEST_ADDR=10.78.0.2 RDMA_TEST_PEER_ADDR=10.78.0.1 RDMA_TEST_ADDR6=fd78::2 RDMA_TEST_PEER_ADDR6=fd78::1 RDMA_TEST_SILENT_ADDR=10.78.0.3' "$@"
mkdir "$ctl"
dgram() { # dgram P Q: the NIC whose end of the link is UDP port P, talking to port Q
	echo "dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=$1,remote.type=inet,remote.host=127.0.0.1,remote.port=$2"
}
timeout -k 10 "$timeout_s" "${qemu[@]}" -smp 1 -append "$append testbed.host=1" \
	-netdev "$(dgram "${ports[0]}" "${ports[1]}")" -device virtio-net-pci,netdev=n0,mac=52:54:00:78:00:01,romfile= \
	-virtfs "local,path=$a,mount_tag=job,security_model=none" \
	</dev/null >"$a/console.log" 2>&1 &
qpid=$!
tail -s 0.2 -n +1 -f --pid="$qpid" "$a/output" &
tpid=$!
# Staggered by a second as in the recipe that was verified (docs/testbed.md). b's own timeout
# is only a backstop should this script die without its trap: b ends when a does. romfile=
# (both hosts) skips the NIC's iPXE boot ROM, which we never use and which SeaBIOS would
# otherwise run for a few seconds under TCG.
sleep 1
timeout -k 10 "$((timeout_s + 60))" "${qemu[@]}" -smp 1 -append "$append testbed.host=2" \
	-netdev "$(dgram "${ports[1]}" "${ports[0]}")" -device virtio-net-pci,netdev=n0,mac=52:54:00:78:00:02,romfile= \
	-virtfs "local,path=$b,mount_tag=job,security_model=none" -pidfile "$job/b.pid" \
	</dev/null >"$b/console.log" 2>&1 &
bpid=$!
killed=''
while kill -0 "$qpid" 2>/dev/null; do
	[[ -e $ctl/peer-started || ! -e $b/started ]] || : >"$ctl/peer-started"
	if [[ -z $killed && -e $ctl/kill-peer ]]; then
		stop_b
		killed=$SECONDS
		: >"$ctl/peer-killed"
	fi
	sleep 0.2
done
rc=0
wait "$qpid" || rc=$?
qpid=
wait "$tpid" || true
tpid=
# b that is still running is merely cut short; b that ended on its own must have finished its
# command, or it failed as a test bed (no boot, no rxe0, a crash) and a's verdict means little.
b_failed=''
if [[ -z $killed ]]; then
	kill -0 "$bpid" 2>/dev/null || [[ -f $b/status ]] || b_failed=1
	stop_b
fi
[[ ! -s $b/output ]] || sed 's/^/[b] /' "$b/output" >&2
if [[ -n ${RDMA_TESTBED_VERBOSE:-} ]]; then
	up() { grep -o 'job start: uptime [0-9.]*' "$1/console.log" || echo 'no job start'; }
	echo "testbed: pair ran $((SECONDS - start)) s; a: $(up "$a"); b: $(up "$b")${killed:+; b killed at $((killed - start)) s}" >&2
fi
if ((rc == 124 || rc == 137)); then # 137: qemu ignored TERM and needed timeout's KILL
	echo "testbed: host a timed out after $timeout_s s" >&2
	exit 124
fi
[[ -f $a/status ]] || vm_failed "$a" 'host a'
[[ -z $b_failed ]] || vm_failed "$b" 'host b'
[[ -f $a/status && -z $b_failed ]] || exit 125
exit "$(cat "$a/status")"
