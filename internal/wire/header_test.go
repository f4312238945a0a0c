package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    Header
	}{
		{"data", Header{Type: MsgData}},
		{"data with credits", Header{Type: MsgData, CtrlAck: 1, Credits: 64}},
		{"credit", Header{Type: MsgCredit, Credits: 7}},
		{"fin", Header{Type: MsgFin, CtrlAck: CtrlDepth}},
		{"wants", Header{Type: MsgData, Wants: true, Credits: 3}},
		{"max", Header{Type: 0x7f, Wants: true, CtrlAck: 0xff, Credits: 0xffff}},
		{"zero", Header{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.h, HeaderOf(tc.h.Imm()))
			// The layout is part of the wire format: the wants flag,
			// type, ctrlAck, credits.
			want := uint32(tc.h.Type)<<24 | uint32(tc.h.CtrlAck)<<16 | uint32(tc.h.Credits)
			if tc.h.Wants {
				want |= 1 << 31
			}
			require.Equal(t, want, tc.h.Imm())
		})
	}
	// Any immediate decodes to a type of 7 bits (an unknown one is the
	// receiver's to refuse) and the flag.
	require.Equal(t, Header{Type: 0x7f, Wants: true, CtrlAck: 0xff, Credits: 0xffff}, HeaderOf(0xffffffff))
}

// A header as a SEND's payload: the immediate, then the data message's
// length, big-endian.
func TestHeaderSlot(t *testing.T) {
	h := Header{Type: MsgDataMore, Wants: true, CtrlAck: 2, Credits: 0x0304}
	b := make([]byte, HeaderSlot)
	PutHeaderSlot(b, h, 0x05060708)
	require.Equal(t, []byte{0x84, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08}, b[:HeaderLen])
	got, n := ParseHeaderSlot(b)
	require.Equal(t, h, got)
	require.Equal(t, uint32(0x05060708), n)
	require.Equal(t, 80, HeaderSlot)
}

// Every type this version sends is data, control or the fin, and only
// one of them.
func TestMessageClasses(t *testing.T) {
	for typ := uint8(0); typ < 0x80; typ++ {
		data, ctrl := IsData(typ), IsControl(typ)
		known := typ >= MsgData && typ <= MsgDecline
		require.False(t, data && ctrl, "type %d", typ)
		require.Equal(t, known && typ != MsgFin, data || ctrl, "type %d", typ)
	}
}
