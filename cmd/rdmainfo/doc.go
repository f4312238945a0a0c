// Command rdmainfo asks a machine, before deploying a service on
// github.com/goverbs/rdma, what it offers: its RDMA devices, their ports and
// state, MTU, GIDs (and the IP address each stands for, the one to Listen
// or Dial on), the process's locked-memory limit, and how many connections
// with given Options fit in that limit and in each device.
//
//	rdmainfo                                  # text, for the default Options
//	rdmainfo -json                            # the same as one JSON document
//	rdmainfo -buffer 16384 -recv-depth 64     # for these Options
//
// -buffer, -send-depth and -recv-depth are Options.BufferSize, SendDepth and
// RecvDepth (0: the library's defaults, 64 KiB, 16 and 64; -sdepth and
// -rdepth are rdmaperf's names for the depths). Run it as the service's
// user and under its limits (ulimit -l, LimitMEMLOCK): the limit and the
// capability it reports are its own process's.
//
// Each connection end (a dialed connection, or one accepted by a listener)
// registers Options.RegisteredMemory bytes when idle (more while it streams:
// Options.GrownRegisteredMemory), counted against RLIMIT_MEMLOCK
// unless the process has CAP_IPC_LOCK; and it reserves RecvDepth +
// SendDepth + 28 entries of a completion queue of its device (receives with
// 5 reserved for credits and the fin, sends, 5 control sends, 16 one-sided
// operations, the keepalive probe and the teardown's drain marker):
// one process's connections share CQs of at most max_cqe entries, as many
// as needed up to the device's max_cq; each also takes one of the device's
// max_qp queue pairs and two of its max_mr memory regions (and a protection
// domain of its own). Both figures are
// per process.
//
// The exit status is 0 when some port is ACTIVE, 1 when no device has an
// active port (or none could be listed), 2 for a bad command line.
//
// The JSON document (-json):
//
//	{
//	  "devices": [                    // every RDMA device of the host
//	    {
//	      "name": "rxe0",
//	      "node_type": "InfiniBand channel adapter",
//	      "error": "...",             // only when it could not be opened or queried
//	      "vendor_id": 16777215,      // IEEE OUI
//	      "vendor_part_id": 0,
//	      "node_guid": "3cf9:ebff:fe8b:de84",
//	      "firmware": "0.0.0",
//	      "max_qp": 1048560, "max_qp_wr": 1048576, "max_cq": 16384, "max_cqe": 32767,
//	      "max_mr": 524287, "max_pd": 1048576, "max_mr_size": 18446744073709551615,
//	      "connections": 262143,      // connection ends of one process that fit: min(max_cq × ⌊max_cqe / cq_entries⌋, max_qp, ⌊max_mr / 2⌋, max_pd)
//	      "ports": [
//	        {
//	          "port": 1,
//	          "error": "...",         // only when ibv_query_port failed
//	          "state": "ACTIVE",      // DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER
//	          "phys_state": "LINK_UP",// SLEEP, POLLING, DISABLED, LINK_UP, ...; omitted when unknown
//	          "link_layer": "Ethernet", // or InfiniBand
//	          "active_mtu": 1024, "max_mtu": 4096, // bytes
//	          "active_width": "1X", "active_speed": "2.5 Gbps", // omitted when unknown
//	          "lid": 0,               // InfiniBand only
//	          "gids": [               // the valid entries of the GID table
//	            {
//	              "index": 1,
//	              "gid": "0000:0000:0000:0000:0000:ffff:0a4d:0001",
//	              "type": "RoCE v2",  // RoCE v1, or IB
//	              "netdev": "rd0",    // RoCE: the interface it belongs to
//	              "ip": "10.77.0.1"   // RoCE: the IPv4 (mapped) or IPv6 address it is
//	            }
//	          ]
//	        }
//	      ]
//	    }
//	  ],
//	  "devices_error": "...",         // only when the devices could not be listed
//	  "memlock": {                    // RLIMIT_MEMLOCK of this process
//	    "soft": 8388608,              // bytes, or "unlimited"
//	    "hard": 8388608,              // bytes, or "unlimited"
//	    "cap_ipc_lock": false,        // CAP_IPC_LOCK in the effective set: the limit does not apply
//	    "connections": 256            // idle connection ends that fit in the soft limit, or "unlimited"
//	  },
//	  "options": {                    // the Options asked about, defaults filled in
//	    "buffer_size": 65536, "send_depth": 16, "recv_depth": 64,
//	    "registered_bytes": 32768,    // per idle connection end: Options.RegisteredMemory
//	    "grown_registered_bytes": 2129920, // per connection end streaming both ways: Options.GrownRegisteredMemory
//	    "cq_entries": 108             // per connection end: RecvDepth + SendDepth + 28
//	  }
//	}
package main
