//go:build faultinject && linux && cgo

// Interposed write, read and ioctl: see doc.go.

#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>
#include <stdio.h>

#include "faults.h"

static atomic_int armed;
static atomic_long calls;  // counted calls since arming
static atomic_long fail_at; // the first call to fail (1-based); 0: none
static atomic_long fail_n;  // how many calls from fail_at on fail
static atomic_int fail_errno;
static atomic_int only;     // 0: any counted call; else only calls of this code

// The codes of the counted calls, in order, for the test to name them.
static uint32_t trace[GVF_TRACE];
static atomic_long failed; // calls made to fail

// gvf_kind classifies a descriptor: 0 when it is not an RDMA one.
static int gvf_kind(int fd) {
	char path[64], link[128];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	ssize_t n = syscall(SYS_readlink, path, link, sizeof link - 1);
	if (n <= 0)
		return 0;
	link[n] = 0;
	if (strcmp(link, "/dev/infiniband/rdma_cm") == 0)
		return GVF_UCMA;
	if (strncmp(link, "/dev/infiniband/uverbs", 22) == 0)
		return GVF_UVERBS;
	if (strstr(link, "[infinibandevent]") != NULL)
		return GVF_EVENT;
	return 0;
}

// gvf_hit counts a call of the given code and reports whether it fails.
static int gvf_hit(uint32_t code) {
	int o = atomic_load(&only);
	if (o && (int)(code >> 24) != o && (int)code != o)
		return 0;
	long n = atomic_fetch_add(&calls, 1) + 1;
	if (n <= GVF_TRACE)
		trace[n - 1] = code;
	long at = atomic_load(&fail_at);
	if (at > 0 && n >= at && n < at + atomic_load(&fail_n)) {
		atomic_fetch_add(&failed, 1);
		return 1;
	}
	return 0;
}

// The command a write carries: ucma's and uverbs' both start with a
// 32-bit command number.
static uint32_t gvf_write_code(int kind, const void *buf, size_t len) {
	uint32_t cmd = 0;
	if (len >= 4)
		memcpy(&cmd, buf, 4);
	if (kind == GVF_UVERBS)
		cmd &= 0xff; // the low byte; the rest are flags of extended commands
	return (uint32_t)kind << 24 | (cmd & 0xffff);
}

// The command an ioctl carries: struct ib_uverbs_ioctl_hdr (length,
// object_id, method_id, num_attrs as u16, then 16 bytes) and its
// attributes (struct ib_uverbs_attr, 16 bytes each: attr_id, len, flags,
// attr_data as u16, then data as u64). A write command sent as an ioctl
// (object DEVICE, method INVOKE_WRITE) is named by its command, found in
// attribute WRITE_CMD (2), like the same command written.
static uint32_t gvf_ioctl_code(const void *arg) {
	if (arg == NULL)
		return (uint32_t)GVF_IOCTL << 24;
	const uint16_t *hdr = arg;
	uint16_t obj = hdr[1], method = hdr[2], nattrs = hdr[3];
	if (obj == 0 && method == 0) {
		const uint8_t *attrs = (const uint8_t *)arg + 24;
		for (int i = 0; i < nattrs && i < 16; i++) {
			uint16_t id;
			uint64_t data;
			memcpy(&id, attrs + 16 * i, 2);
			memcpy(&data, attrs + 16 * i + 8, 8);
			if (id == 2)
				return (uint32_t)GVF_UVERBS << 24 | (uint32_t)(data & 0xff);
		}
	}
	return (uint32_t)GVF_IOCTL << 24 | (uint32_t)(obj & 0xff) << 8 | (method & 0xff);
}

ssize_t write(int fd, const void *buf, size_t len) {
	if (atomic_load(&armed)) {
		int kind = gvf_kind(fd);
		if ((kind == GVF_UCMA || kind == GVF_UVERBS) && gvf_hit(gvf_write_code(kind, buf, len))) {
			errno = atomic_load(&fail_errno);
			return -1;
		}
	}
	return syscall(SYS_write, fd, buf, len);
}

ssize_t read(int fd, void *buf, size_t len) {
	if (atomic_load(&armed)) {
		int kind = gvf_kind(fd);
		if (kind == GVF_EVENT && gvf_hit((uint32_t)GVF_EVENT << 24)) {
			errno = atomic_load(&fail_errno);
			return -1;
		}
	}
	return syscall(SYS_read, fd, buf, len);
}

int ioctl(int fd, unsigned long req, ...) {
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (atomic_load(&armed)) {
		int kind = gvf_kind(fd);
		if (kind == GVF_UVERBS) {
			uint32_t code = gvf_ioctl_code(arg);
			if (gvf_hit(code)) {
				errno = atomic_load(&fail_errno);
				return -1;
			}
		}
	}
	return syscall(SYS_ioctl, fd, req, arg);
}

void gvf_arm(long at, long n, int err, int code) {
	atomic_store(&armed, 0);
	atomic_store(&calls, 0);
	atomic_store(&failed, 0);
	atomic_store(&fail_at, at);
	atomic_store(&fail_n, n);
	atomic_store(&fail_errno, err);
	atomic_store(&only, code);
	atomic_store(&armed, 1);
}

long gvf_disarm(void) {
	atomic_store(&armed, 0);
	return atomic_load(&calls);
}

long gvf_calls(void) { return atomic_load(&calls); }
long gvf_failed(void) { return atomic_load(&failed); }
uint32_t gvf_trace(long i) { return i >= 0 && i < GVF_TRACE ? trace[i] : 0; }
