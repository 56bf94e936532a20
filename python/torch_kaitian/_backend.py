"""_backend.py - the creator torch calls for a "kaitian" group
(Backend.register_backend in torch_kaitian/__init__.py): a group of one rank
communicates nothing (_solo.py), any other is a ProcessGroupKaitian."""
from ._solo import ProcessGroupKaitianSolo
from .process_group import ProcessGroupKaitian


def create(store, rank, size, timeout):
    """The backend creator torch calls (Backend.register_backend)."""
    if size == 1:
        return ProcessGroupKaitianSolo(store, rank, size, timeout)
    return ProcessGroupKaitian(store, rank, size, timeout)


def _create_extended(dist_opts, pg_opts=None):
    return create(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout)

