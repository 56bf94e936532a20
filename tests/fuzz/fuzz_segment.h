/* fuzz_segment.h - for the harnesses that include src/transport/shm.c: lay
 * out a segment in ordinary memory at base (bytes long, zeroed here) for n
 * ranks with regions and rings of the given sizes, and point s at it as
 * local rank 0 sees it (single-copy allreduce off). */
#ifndef KT_FUZZ_SEGMENT_H
#define KT_FUZZ_SEGMENT_H

static void fuzz_segment(kt__shm *s, void *base, size_t bytes, int n, size_t region, size_t p2p) {
  memset(base, 0, bytes);
  memset(s, 0, sizeof *s);
  s->base = base;
  s->bytes = bytes;
  s->hdr = base;
  s->n = n;
  s->me = 0;
  s->region = region;
  s->fd = -1;
  s->chans = (chan *)((char *)base + chans_offset(n));
  s->rings = (char *)base + rings_offset(n, region);
  s->p2p = p2p;
  s->direct_off = true;
  s->hdr->nlocal = (uint32_t)n;
  s->hdr->region = region;
  s->hdr->p2p = p2p;
  s->hdr->bytes = bytes;
}

#endif
