package rdma

import "context"

// The bounce memory of ReadAt and WriteAt: chunks of registered memory
// (local access only, registered on first use) that a plain []byte's
// bytes pass through on their way to or from a peer's region.
//
// A caller copies into a chunk before its operation and out of it after
// the completion, without the connection's lock, so the release (which
// may come at any time: a Close, a failure, the device's removal) must
// not unmap memory a caller may still be copying; nor may it wait for
// the callers, whose operations the drain may have given up on. So the
// release revokes the bounce memory at once (the NIC's access ends with
// its registration), and the memory is unmapped once no caller holds a
// chunk: by the release if none does, else by the last putChunk. A
// caller holding a chunk then cannot start another operation (the
// connection is over), so it gives the chunk back soon.

// Bounce memory of ReadAt and WriteAt: bounceChunks chunks of
// bounceChunk bytes, registered (local access only) on first use.
const (
	bounceChunk  = 64 << 10
	bounceChunks = 4
)

// bounceIO reads (op opRead) the peer's bytes at off into p, or writes p
// there, through the connection's bounce memory: up to bounceChunks
// chunks in flight, completed in order. It returns how many bytes from
// the start of p were moved.
func (c *Conn) bounceIO(op uint8, p []byte, key RemoteKey, off uint64) (int, error) {
	type pending struct{ slot, chunk, pos, n int }
	var q [bounceChunks]pending
	head, cnt := 0, 0
	done, pos := 0, 0
	var firstErr error
	bg := context.Background()
	for {
		if pos < len(p) && firstErr == nil && cnt < bounceChunks {
			// Block for a chunk only with nothing of ours in flight:
			// callers that hold chunks never wait for each other.
			chunk, err := c.getChunk(cnt == 0)
			if err != nil {
				firstErr = err
				continue
			}
			if chunk >= 0 {
				k := min(bounceChunk, len(p)-pos)
				at := chunk * bounceChunk
				if op == opWrite {
					copy(c.os.bounce.mem[at:at+k], p[pos:pos+k])
				}
				slot, err := c.startOneSided(bg, op, c.os.bounce, at, k, key, off+uint64(pos), 0, 0)
				if err != nil {
					c.putChunk(chunk)
					firstErr = err
					continue
				}
				q[(head+cnt)%bounceChunks] = pending{slot, chunk, pos, k}
				cnt++
				pos += k
				continue
			}
		}
		if cnt == 0 {
			return done, firstErr
		}
		e := q[head]
		head = (head + 1) % bounceChunks
		cnt--
		_, err := c.waitOneSided(bg, e.slot)
		if err == nil && firstErr == nil {
			if op == opRead {
				at := e.chunk * bounceChunk
				copy(p[e.pos:e.pos+e.n], c.os.bounce.mem[at:at+e.n])
			}
			done += e.n
		} else if firstErr == nil {
			firstErr = err
		}
		c.putChunk(e.chunk)
	}
}

// bounceSize is the bounce memory's size: the chunks, and behind them 8
// bytes per one-sided slot for the old values of atomics (see atomicAt).
const bounceSize = bounceChunks*bounceChunk + oneSidedDepth*AtomicSize

// ensureBounce registers the bounce memory on first use.
func (c *Conn) ensureBounce() error {
	if c.os.bounceUp.Load() {
		return nil // whether the connection still works, posting tells
	}
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.os.init()
	if err := c.oneSidedEnded(); err != nil {
		return err
	}
	if c.os.bounce != nil {
		return nil
	}
	c.mu.Unlock()
	b, err := c.registerMem(bounceSize, 0, nil)
	c.mu.Lock()
	if err != nil {
		return err
	}
	c.os.bounce = b
	c.os.bounceUp.Store(true)
	c.os.chunksFree = make([]int, 0, bounceChunks)
	for i := bounceChunks - 1; i >= 0; i-- {
		c.os.chunksFree = append(c.os.chunksFree, i)
	}
	return nil
}

// getChunk takes a free bounce chunk, registering the bounce memory on
// first use; with wait unset it returns -1 when none is free instead of
// waiting.
func (c *Conn) getChunk(wait bool) (int, error) {
	if err := c.ensureBounce(); err != nil {
		return -1, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if err := c.oneSidedEnded(); err != nil {
			return -1, err
		}
		if n := len(c.os.chunksFree); n > 0 {
			i := c.os.chunksFree[n-1]
			c.os.chunksFree = c.os.chunksFree[:n-1]
			c.os.chunksOut++
			if n > 1 {
				signal(c.os.chunkRoom) // another waiter may take the next one
			}
			return i, nil
		}
		if !wait {
			return -1, nil
		}
		c.mu.Unlock()
		select {
		case <-c.os.chunkRoom:
		case <-c.closing:
		}
		c.mu.Lock()
	}
}

// putChunk gives a bounce chunk back; the last one back after the
// release unmaps the bounce memory.
func (c *Conn) putChunk(i int) {
	c.mu.Lock()
	c.os.chunksFree = append(c.os.chunksFree, i)
	c.os.chunksOut--
	signal(c.os.chunkRoom)
	c.wakeRelease()
	mem := c.takeBounceMem()
	c.mu.Unlock()
	unmapMem(mem)
}

// takeBounceMem returns the bounce memory for the caller to unmap, once
// the release revoked it and no caller holds a chunk of it, and nil
// until then (or when its deregistration failed: the NIC may still use
// it); mu is held.
func (c *Conn) takeBounceMem() []byte {
	b := c.os.bounce
	if b == nil || !c.os.bounceGone || c.os.chunksOut > 0 || b.revokeErr != nil {
		return nil
	}
	mem := b.mem
	b.mem = nil
	return mem
}
