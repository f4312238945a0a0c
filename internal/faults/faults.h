// The kinds of counted calls (the top byte of a call's code).
#define GVF_UCMA 1   // a write to /dev/infiniband/rdma_cm: the command in the low bits
#define GVF_UVERBS 2 // a write to /dev/infiniband/uverbsN: the command in the low byte
#define GVF_IOCTL 3  // an ioctl on uverbsN: object << 8 | method
#define GVF_EVENT 4  // a read of a completion or asynchronous event file

#define GVF_TRACE 65536

#include <stdint.h>
void gvf_arm(long at, long n, int err, int code);
long gvf_disarm(void);
long gvf_calls(void);
long gvf_failed(void);
uint32_t gvf_trace(long i);
