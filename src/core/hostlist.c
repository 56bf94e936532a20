/* hostlist.c - Slurm's compressed host lists, read without scontrol.
 *
 *   node[01-04,07],gpu-a[1-2]   ->  node01 node02 node03 node04 node07 gpu-a1 gpu-a2
 *   rack[1-2]-n[1-2]            ->  rack1-n1 rack1-n2 rack2-n1 rack2-n2
 *
 * A list is entries separated by commas (or spaces) outside brackets, empty
 * entries skipped; an entry is text
 * with any number of bracket groups, each a comma-separated list of numbers
 * and ranges LO-HI. A range keeps the width of LO when LO has a leading
 * zero (01-10 gives 01..10), else numbers are written as they are. Several
 * groups in an entry expand as nested loops, the first outermost (the same
 * hosts as `scontrol show hostnames`, which orders three or more groups
 * differently; the first host, the one a job needs, is the same).
 *
 * Nothing is allocated: the list is walked again for each host asked for,
 * which is cheap for the one or two lookups a job needs. */
#include "jobenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUPS 8

typedef struct group {
  const char *body; /* between the brackets */
  size_t len;
  unsigned long long size; /* hosts it expands to */
} group;

/* A number of 1..18 digits at s[0..len); false when it is not one. */
static bool parse_num(const char *s, size_t len, unsigned long long *v) {
  if (len == 0 || len > 18) return false;
  *v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    *v = *v * 10 + (unsigned long long)(s[i] - '0');
  }
  return true;
}

/* Walk the ranges of one group: its size, or (want < size) write the
 * want-th number into out. Returns false with *why set on bad syntax. */
static bool walk_group(const char *body, size_t len, unsigned long long want, unsigned long long *size,
                       char *out, size_t cap, const char **why) {
  *size = 0;
  size_t i = 0;
  while (i <= len) {
    size_t j = i;
    while (j < len && body[j] != ',') j++;
    const char *r = body + i;
    size_t rlen = j - i, dash = 0;
    while (dash < rlen && r[dash] != '-') dash++;
    unsigned long long lo, hi;
    if (!parse_num(r, dash, &lo)) {
      *why = rlen == 0 ? "an empty range" : "a range that is not NUMBER or LO-HI";
      return false;
    }
    hi = lo;
    if (dash < rlen && !parse_num(r + dash + 1, rlen - dash - 1, &hi)) {
      *why = "a range that is not NUMBER or LO-HI";
      return false;
    }
    if (hi < lo) {
      *why = "a range whose end is below its start";
      return false;
    }
    unsigned long long n = hi - lo + 1;
    if (want >= *size && want - *size < n && out) {
      int width = r[0] == '0' ? (int)dash : 1;
      snprintf(out, cap, "%0*llu", width, lo + (want - *size));
    }
    *size += n;
    if (*size > KT_HOSTLIST_MAX) {
      *why = "more hosts than a job can have";
      return false;
    }
    i = j + 1;
  }
  return true;
}

/* Split entry [s, s+len) into groups; the entry's host count in *count. */
static bool parse_entry(const char *s, size_t len, group *g, int *ng, unsigned long long *count,
                        const char **why) {
  *ng = 0;
  *count = 1;
  if (len == 0) {
    *why = "an empty host name";
    return false;
  }
  for (size_t i = 0; i < len; i++) {
    if (s[i] == ']') {
      *why = "a ']' without '['";
      return false;
    }
    if (s[i] != '[') continue;
    size_t j = i + 1;
    while (j < len && s[j] != ']' && s[j] != '[') j++;
    if (j >= len || s[j] != ']') {
      *why = j < len ? "a '[' inside brackets" : "a '[' without ']'";
      return false;
    }
    if (*ng == MAX_GROUPS) {
      *why = "more than 8 bracket groups in one host name";
      return false;
    }
    group *gr = &g[(*ng)++];
    gr->body = s + i + 1;
    gr->len = j - i - 1;
    if (!walk_group(gr->body, gr->len, 0, &gr->size, NULL, 0, why)) return false;
    *count *= gr->size;
    if (*count > KT_HOSTLIST_MAX) {
      *why = "more hosts than a job can have";
      return false;
    }
    i = j;
  }
  return true;
}

/* Write host `idx` of the entry into out. */
static bool entry_host(const char *s, size_t len, const group *g, int ng, unsigned long long idx, char *out,
                       size_t cap, const char **why) {
  /* Mixed radix, the last group fastest. */
  unsigned long long digit[MAX_GROUPS];
  for (int k = ng - 1; k >= 0; k--) {
    digit[k] = idx % g[k].size;
    idx /= g[k].size;
  }
  size_t o = 0;
  int k = 0;
  for (size_t i = 0; i < len; i++) {
    char num[24] = "";
    const char *piece = s + i;
    size_t plen = 1;
    if (s[i] == '[') {
      unsigned long long size;
      walk_group(g[k].body, g[k].len, digit[k], &size, num, sizeof num, why);
      piece = num;
      plen = strlen(num);
      i += g[k].len + 1;
      k++;
    }
    if (o + plen >= cap) {
      *why = "a host name longer than 255 characters";
      return false;
    }
    memcpy(out + o, piece, plen);
    o += plen;
  }
  out[o] = '\0';
  return true;
}

/* The common walk: the count of hosts, and host `want` into out. */
static kt_result walk(const char *list, long want, long *count, char *out, size_t cap) {
  if (!list) return kt__err(KT_ERR_INVALID_ARGUMENT, "host list is NULL");
  const char *why = NULL;
  unsigned long long total = 0;
  size_t len = strlen(list), i = 0;
  bool found = false;
  if (len == 0) {
    why = "it is empty";
    goto bad;
  }
  while (i <= len) {
    size_t j = i;
    int depth = 0;
    while (j < len && (depth || (list[j] != ',' && list[j] != ' '))) {
      if (list[j] == '[') depth++;
      else if (list[j] == ']' && depth) depth--;
      if ((unsigned char)list[j] < ' ' || list[j] == 0x7f || (depth && list[j] == ' ')) {
        why = "a control character, or a space inside brackets";
        goto bad;
      }
      j++;
    }
    if (j == i) { /* "a,,b": an empty entry, skipped as Slurm does */
      i = j + 1;
      continue;
    }
    group g[MAX_GROUPS];
    int ng;
    unsigned long long n;
    if (!parse_entry(list + i, j - i, g, &ng, &n, &why)) goto bad;
    if (want >= 0 && !found && (unsigned long long)want < total + n) {
      if (!entry_host(list + i, j - i, g, ng, (unsigned long long)want - total, out, cap, &why)) goto bad;
      found = true;
    }
    total += n;
    if (total > KT_HOSTLIST_MAX) {
      why = "more hosts than a job can have";
      goto bad;
    }
    i = j + 1;
  }
  if (total == 0) {
    why = "it names no host";
    goto bad;
  }
  if (count) *count = (long)total;
  if (want >= 0 && !found)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "host list '%.200s' has %llu hosts, no host %ld", list, total, want);
  return KT_SUCCESS;
bad:
  return kt__err(KT_ERR_INVALID_ARGUMENT, "bad host list '%.200s': %s", list, why);
}

kt_result kt__hostlist_count(const char *list, long *count) { return walk(list, -1, count, NULL, 0); }

kt_result kt__hostlist_nth(const char *list, long idx, char *out, size_t cap) {
  if (idx < 0) return kt__err(KT_ERR_INVALID_ARGUMENT, "host index %ld is negative", idx);
  return walk(list, idx, NULL, out, cap);
}

/* SLURM_TASKS_PER_NODE: "2(x3),1" is 2 tasks on each of 3 nodes, then 1. */
kt_result kt__tasks_per_node(const char *spec, int node, int *tasks, int *nnodes, long *total) {
  if (!spec) return kt__err(KT_ERR_INVALID_ARGUMENT, "tasks per node is NULL");
  long seen = 0, sum = 0;
  int found = -1;
  const char *p = spec;
  for (;;) {
    char *end;
    long t = strtol(p, &end, 10);
    long rep = 1;
    if (end == p || t < 1 || t > 1 << 20 || *p == '-' || *p == '+' || *p == ' ') goto bad; /* every node has a task */
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') goto bad;
      const char *q = p + 2;
      rep = strtol(q, &end, 10);
      if (end == q || *q == '-' || *q == '+' || *q == ' ' || rep < 1 || rep > KT_HOSTLIST_MAX || *end != ')')
        goto bad;
      p = end + 1;
    }
    if (node >= seen && node < seen + rep) found = (int)t;
    seen += rep;
    sum += t * rep;
    if (sum > 1L << 40) goto bad;
    if (seen > KT_HOSTLIST_MAX) goto bad;
    if (*p == '\0') break;
    if (*p != ',') goto bad;
    p++;
  }
  if (nnodes) *nnodes = (int)seen;
  if (tasks) *tasks = found;
  if (total) *total = sum;
  return KT_SUCCESS;
bad:
  return kt__err(KT_ERR_INVALID_ARGUMENT, "bad tasks-per-node list '%.200s' (expected e.g. 2(x3),1)", spec);
}
