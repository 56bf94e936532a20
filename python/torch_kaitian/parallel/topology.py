"""topology.py - the process groups of a multi-dimensional parallel job, in an
order the user chooses.

    topo = Topology([("pipe", 2), ("tensor", 2), ("data", 2)])   # 8 ranks
    topo.group("data"), topo.rank("tensor"), topo.coords(), topo.group("model")

Axes are listed outermost first; the last varies fastest, so its groups are
runs of consecutive ranks (which `kaitian run` places on one host): put the
axis with the heaviest traffic last. An object, not module globals: several
topologies may live in one job.
"""
import itertools
import socket

import torch.distributed as dist

__all__ = ["Topology"]

MODEL = "model"  # the derived axis: every axis but "data"


class Topology:
    """Process groups for every axis of `axes`, a list of (name, size) pairs,
    outermost first, whose sizes multiply to the number of ranks.

    ranks: the global ranks the topology covers, ascending (default: all of the
    default group). Every rank of the default group must construct it (torch's
    rule for new_group), with the same arguments; ranks outside `ranks` get
    an object whose queries raise.

    Groups of the same members are created once and shared (an axis of size 1
    and "model" with a single other axis cost no extra group)."""

    def __init__(self, axes, ranks=None):
        if not dist.is_initialized():
            raise RuntimeError("Topology: call torch.distributed.init_process_group first")
        me = dist.get_rank()
        world = dist.get_world_size()
        self._axes = self._check_axes(axes, me)
        self.names = [n for n, _ in self._axes]
        self.sizes = [s for _, s in self._axes]
        ranks = list(range(world)) if ranks is None else [int(r) for r in ranks]
        total = 1
        for s in self.sizes:
            total *= s
        if ranks != sorted(set(ranks)) or any(not 0 <= r < world for r in ranks):
            # ascending: torch numbers a group's ranks in ascending order, and so do
            # the coordinates here
            raise ValueError(f"rank {me}: Topology: ranks must be distinct ranks of the job "
                             f"(0..{world - 1}) in ascending order, got {ranks}")
        if total != len(ranks):
            shape = " x ".join(f"{n} {s}" for n, s in self._axes)
            raise ValueError(f"rank {me}: Topology: {shape} = {total} ranks, but there are "
                             f"{len(ranks)} ({'the world size' if len(ranks) == world else 'ranks='})")
        self.ranks = ranks
        self.member = me in ranks
        self._index = ranks.index(me) if self.member else None
        self._groups, self._members = {}, {}
        cache = {}
        for axis in self.names + ([MODEL] if MODEL not in self.names else []):
            for members in self._all_groups(axis):
                key = tuple(members)
                if key not in cache:  # every rank creates every group, in this order
                    cache[key] = dist.new_group(list(key)) if len(key) < world else dist.group.WORLD
                if self.member and me in members:
                    self._groups[axis] = cache[key]
                    self._members[axis] = list(members)
        hosts = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        self._hosts = hosts

    @staticmethod
    def _check_axes(axes, me):
        out = []
        try:
            items = list(axes)
        except TypeError:
            items = None
        if not items:
            raise ValueError(f"rank {me}: Topology: axes must be a non-empty list of (name, size) "
                             f"pairs, outermost first, e.g. [('pipe', 2), ('data', 4)]")
        for item in items:
            if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], int) and not isinstance(item[1], bool)):
                raise ValueError(f"rank {me}: Topology: each axis is a (name, size) pair, got "
                                 f"{item!r}")
            name, size = item
            if size < 1:
                raise ValueError(f"rank {me}: Topology: axis {name!r} has size {size}; sizes are "
                                 f">= 1")
            if name == MODEL:
                raise ValueError(f"rank {me}: Topology: {MODEL!r} is the derived axis (every axis "
                                 f"but 'data'); name the axes otherwise")
            if name in [n for n, _ in out]:
                raise ValueError(f"rank {me}: Topology: axis {name!r} appears twice")
            out.append((name, size))
        return out

    # ---- layout (pure functions of the axes) -------------------------------------
    def coords_of(self, index):
        """Coordinates (a dict name -> index) of position `index` in self.ranks."""
        out = {}
        for name, size in reversed(self._axes):
            out[name] = index % size
            index //= size
        return {n: out[n] for n in self.names}

    def index_of(self, coords):
        """The position in self.ranks of the given coordinates (a dict)."""
        i = 0
        for name, size in self._axes:
            c = coords[name]
            if not 0 <= c < size:
                raise ValueError(f"Topology: coordinate {name}={c} is outside 0..{size - 1}")
            i = i * size + c
        return i

    def _varying(self, axis):
        if axis == MODEL:
            return [n for n in self.names if n != "data"]
        if axis not in self.names:
            raise KeyError(f"Topology: no axis {axis!r} (axes: {', '.join(self.names)}, and "
                           f"{MODEL!r})")
        return [axis]

    def _all_groups(self, axis):
        """Every group of `axis` as a list of global ranks, in a fixed order."""
        vary = self._varying(axis)
        fixed = [n for n in self.names if n not in vary]
        size = dict(self._axes)
        out = []
        for fc in itertools.product(*[range(size[n]) for n in fixed]):
            members = []
            for vc in itertools.product(*[range(size[n]) for n in vary]):
                c = dict(zip(fixed, fc))
                c.update(zip(vary, vc))
                members.append(self.ranks[self.index_of(c)])
            out.append(sorted(members))
        return out

    # ---- this rank ------------------------------------------------------------------
    def _mine(self):
        if not self.member:
            raise RuntimeError(f"rank {dist.get_rank()}: not in this Topology (ranks {self.ranks})")

    def group(self, axis):
        """This rank's process group along `axis` (or "model")."""
        self._mine()
        self._varying(axis)
        return self._groups[axis]

    def ranks_in(self, axis):
        """The global ranks of this rank's group along `axis`, in group-rank order."""
        self._mine()
        self._varying(axis)
        return list(self._members[axis])

    def rank(self, axis):
        """This rank's index in its group along `axis`."""
        return self.ranks_in(axis).index(dist.get_rank())

    def size(self, axis):
        """The size of `axis` (of "model": the product of every axis but "data")."""
        if axis == MODEL:
            n = 1
            for a in self._varying(MODEL):
                n *= dict(self._axes)[a]
            return n
        self._varying(axis)
        return dict(self._axes)[axis]

    def coords(self):
        """This rank's coordinates, a dict in axis order."""
        self._mine()
        return self.coords_of(self._index)

    def describe(self):
        """The layout as a small table: rank, coordinates, host (a string)."""
        w = max([len("rank")] + [len(str(r)) for r in self.ranks])
        cols = [max(len(n), len(str(s - 1))) for n, s in self._axes]
        head = "  ".join([f"{'rank':>{w}s}"] + [f"{n:>{c}s}" for n, c in zip(self.names, cols)] +
                         ["host"])
        lines = [head]
        for i, r in enumerate(self.ranks):
            c = self.coords_of(i)
            lines.append("  ".join([f"{r:>{w}d}"] + [f"{c[n]:>{k}d}" for n, k in
                                                   zip(self.names, cols)] + [self._hosts[r]]))
        return "\n".join(lines)

    def __repr__(self):
        return "Topology(" + ", ".join(f"{n}={s}" for n, s in self._axes) + ")"
