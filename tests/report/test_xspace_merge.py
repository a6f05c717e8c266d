"""merge_xspace (report/xspace.py): the planes of a second XSpace joined to
a first; a plane both have (the host's) gets the other's events with their
metadata renumbered into its own ids."""

import pytest

pytest.importorskip("tensorflow")

from keras_ipu.report import xspace  # noqa: E402


def _space(names, extra_id=None):
    pb = xspace._xplane_pb2()
    space = pb.XSpace()
    plane = xspace._Plane(space.planes.add(), 0, "/host:CPU")
    line = plane.plane.lines.add()
    line.id = 1
    for name in names:
        event = line.events.add()
        event.metadata_id = plane.event_id(name)
        plane.set_stats(event, {"step": 1})
    if extra_id is not None:  # an id the plane's own numbering skipped to
        m = plane.plane.event_metadata[extra_id]
        m.id, m.name = extra_id, "elsewhere"
    return space


def test_a_shared_plane_renumbers_the_other_planes_metadata():
    base = _space(["matmul", "add"], extra_id=10)
    extra = _space(["add", "relu", "relu"])
    extra.planes.add().name = "/device:IPU:0"
    merged = xspace.merge_xspace(base, extra)

    assert [p.name for p in merged.planes] == ["/host:CPU", "/device:IPU:0"]
    host = merged.planes[0]
    names = {k: m.name for k, m in host.event_metadata.items()}
    # Known names keep their ids; a new one takes the next id after the largest.
    assert names == {1: "matmul", 2: "add", 10: "elsewhere", 11: "relu"}
    merged_line = host.lines[1]
    assert [names[e.metadata_id] for e in merged_line.events] == ["add", "relu", "relu"]
    stat_names = {k: m.name for k, m in host.stat_metadata.items()}
    assert all(stat_names[s.metadata_id] == "step" for e in merged_line.events for s in e.stats)
