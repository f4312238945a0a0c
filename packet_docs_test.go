package rdma

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// What the godoc of PacketOptions and docs/datagrams.md say of the
// receives and the sends, against the code.

// TestPacketRecvDepthDoc: RecvDepth's godoc gives the receives that may
// hold a datagram waiting as the code has them: three quarters (384 of
// the default 512), all but 16 under 64 (it said that RecvDepth of them
// may wait).
func TestPacketRecvDepthDoc(t *testing.T) {
	opts, err := PacketOptions{}.normalized()
	require.NoError(t, err)
	waiting := func(depth int) int {
		c := &PacketConn{opts: PacketOptions{RecvDepth: depth}}
		return depth - c.minPosted()
	}
	require.Equal(t, 384, waiting(opts.RecvDepth))
	require.Equal(t, 48, waiting(64))
	require.Equal(t, 16, waiting(minPacketRecvDepth))
	doc := fieldDoc(t, "packet.go", "PacketOptions", "RecvDepth")
	for _, s := range []string{"three quarters", "384 of the default 512", "under 64, all but 16", "local port's active MTU"} {
		require.Contains(t, doc, s)
	}
	require.NotContains(t, doc, "path MTU", "receives are sized by the local port's MTU")
}

// TestPacketSignalingDoc: docs/datagrams.md states the rule by which
// sends are signaled as queueSend has it (sigEvery, and past half of the
// slots in flight), not the "last of each post" it once had, and sizes
// datagrams by the local port's MTU.
func TestPacketSignalingDoc(t *testing.T) {
	require.Equal(t, 16, sigEvery)
	b, err := os.ReadFile("docs/datagrams.md")
	require.NoError(t, err)
	doc := strings.Join(strings.Fields(string(b)), " ")
	for _, s := range []string{"Every sixteenth send is signaled, and every send that leaves more than half of the slots in flight",
		"up to the local port's active MTU less 4 bytes"} {
		require.True(t, strings.Contains(doc, s), "docs/datagrams.md does not say %q", s)
	}
	for _, s := range []string{"the last of each post", "up to the path MTU"} {
		require.False(t, strings.Contains(doc, s), "docs/datagrams.md says %q", s)
	}
}

// fieldDoc returns the doc comment of a struct type's field in a file of
// the package.
func fieldDoc(t *testing.T, file, typ, field string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	require.NoError(t, err)
	var doc string
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != typ {
			return true
		}
		for _, fl := range ts.Type.(*ast.StructType).Fields.List {
			for _, name := range fl.Names {
				if name.Name == field {
					doc = fl.Doc.Text()
				}
			}
		}
		return false
	})
	require.NotEmpty(t, doc, "%s.%s has no doc", typ, field)
	return strings.Join(strings.Fields(doc), " ")
}
