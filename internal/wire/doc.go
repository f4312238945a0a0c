// Package wire is the codec of the protocol two ends of a connection speak:
// the hello of the handshake, the message header, the ring descriptor and
// the placement rule, and the reject's reason; and the header of the
// datagrams a PacketConn sends. It is pure computation on
// bytes and numbers; the state that follows the protocol (credits, the
// rings' running counts, the lifecycle) is its user's.
//
// Handshake: the connect request and the accept reply each carry a hello in
// the rdma_cm private data (IB allows 56 bytes in a request): a magic, a
// version, flags, the sender's receive geometry (how many messages it may
// be sent, how large they may be) and its receive ring: its size, address
// and rkey. One flag (HelloMessages) says the sender's reads are
// message-oriented: then the other side sends each write as messages of
// its own, never merged with another write's bytes.
//
// Each side speaks one version: a listener refuses a request of another
// version (the dialer sees the connection refused), and a dialer fails on a
// reply of another version. Version 3 added the flags and the fragment
// type; version 4 the receive ring; version 5 headers as SEND payloads
// (below); version 6 rings that grow and shrink (below); version 7 the
// header's wants flag (below); version 8 the initiator's first message on
// a transport of header SENDs: the dialing side sends a credit message
// once connected, repeated until it hears from the listener, which sends
// nothing before a message of the dialer's has arrived (iWARP's MPA has
// the initiator send first).
//
// Memory: each side has a receive ring, the only memory the protocol lets
// the peer touch (registered for remote write, never read; memory an
// application registers for one-sided RDMA is its own grant), and a send
// ring of the
// same size that mirrors the peer's receive ring: a message goes from
// offset off of the local send ring to offset off of the peer's receive
// ring. Both sides use the smaller of the two rings' sizes (the span) and
// the same largest message: the smaller of the two the hellos announce,
// and at most half the ring (RingGeometry). Where a message goes is a pure
// function of how many ring bytes came before it (RingPlace), so both
// sides compute it alike without exchanging offsets.
//
// Messages: a data message is an RDMA WRITE with immediate data, and the
// 32-bit immediate is its header (Header), so the ring holds payload
// only: a message of n bytes is exactly that many bytes on the wire. The
// immediate consumes one of the receiver's receives (all of them
// zero-length), which tells it that the message arrived, and how long it
// is. Credit messages and the fin are SENDs with immediate data and no
// payload. Data messages carry payload (never none). A write bigger than
// the largest message travels as several data messages; to a
// message-oriented reader all but the last are fragments (MsgDataMore), so
// the reader knows where each write ends. A stream reader treats both
// types alike.
// Every header piggybacks the credits the sender has freed since its last
// message, so request/response traffic needs no extra messages. A reader
// that has consumed everything and is about to wait returns its credits
// in a message of their own only when the peer's latest header set the
// wants flag: the peer may then come to wait for them (it holds small
// writes while it streams, has a quarter of its credits or less left, or
// its next message might not fit the ring) before it sends again. Without
// the flag the peer waits for no credits before its next message (which
// would set the flag if needed) but those that batches bring, so the
// credits wait for a batch or ride on a reply: a reader goroutine parked
// beside request/response traffic (net/http's, gRPC's) costs no message
// per request, and a reader that drains a stream of large writes faster
// than they come costs one per batch, not one per wait.
//
// Transports without immediate data (iWARP) carry each header as the
// payload of a SEND instead: its HeaderLen bytes are the 32-bit header
// and the data message's length (0 for a control message), big-endian
// (PutHeaderSlot, ParseHeaderSlot). A data message is then its RDMA WRITE
// into the ring followed by that SEND; RC delivers a SEND's completion
// only after the WRITEs posted before it have landed, so the receiver
// finds the payload in place as with the immediate. A data message of at
// most HeaderData bytes may instead follow its header in the SEND itself
// (one work request, not two): the receiver copies it to where the
// placement rule puts it, so both sides' ring arithmetic is the same
// either way. Such a side posts each receive with a slot of HeaderSlot
// bytes and says so in its hello (HelloHeaders); the other side sends to
// it that way. A side that cannot send immediate data refuses a peer that
// wants them.
//
// Credits come in two classes so that returning credits can never wait on
// credits. Data messages spend data credits (the receive depth the peer's
// hello grants). Credit messages spend control credits (CtrlDepth,
// returned by the CtrlAck field of any later message). One more receive
// at each side is reserved for the single fin (FinSlots). A sender
// therefore never has more messages in flight than the peer has receives
// posted, and the NIC never sees receiver-not-ready. Ring bytes need no
// field of their own: a data credit comes back when the receiver has
// consumed a message (in the order they came), which frees the ring bytes
// up to that message's end; a sender that remembers where each message it
// sent ended knows how much ring is free, and sends nothing that would
// overwrite bytes the peer has not read.
//
// Rings that follow the traffic: each side starts with the small ring its
// hello announces and may move its receive ring to another (bigger while
// the peer streams to it, the small one again once it is idle). The
// receiver offers the new ring in a data message of its own (MsgRing,
// whose RingDescLen bytes of payload are the ring's address, rkey and
// size: RingDesc), placed and credited like any data message but never
// given to a reader. The sender answers at a message boundary of its own:
// it sends MsgSwitched, a control message, and from then on places its
// messages in the new ring, the running counts of both sides starting at
// 0 there; messages sent before it stay in the old ring, and their
// credits come back as before. A sender that cannot follow (no memory for
// a send ring that size, or an offer past the registrations it lets its
// peer cause) answers MsgDecline instead, and the receiver keeps the ring
// it had. One offer is outstanding at a time, and the receiver makes the
// next only once the old ring is drained. A ring offered is at least
// MinRing and at most the size its sender accepts (the most of
// ParseRingDesc: 16 of the sender's largest messages up to 1 MiB, at least
// two); the largest message in it is the smaller of the two sides' and at
// most half the ring, as at the handshake.
//
// Datagrams: a PacketConn sends each datagram as the payload of a SEND on
// an unreliable datagram queue pair, after a header (DgramHeader): a
// magic, a version and flags, and the sender's port, which the queue pair
// number does not tell. A datagram bigger than one message (the path's
// MTU) travels as fragments, each with a longer header: the datagram's id,
// its whole length, the fragment's offset, and the fragment size the
// sender cut it into (ParseDatagram, PutDgramHeader). UD neither retries
// nor orders, so the receiver reassembles the fragments in any order and
// drops a datagram that misses one, as IP does; datagrams are at most
// MaxDatagram bytes, as over UDP.
//
// Refusals: a listener that cannot take a connection rejects the request
// with a reason in the reject's private data: the magic, the version and
// a reason byte (MarshalReject, ParseReject); what the reasons mean is
// the user's.
package wire
