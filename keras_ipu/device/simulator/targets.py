"""The IPU generations the simulator models: ipu1 (Mk1 GC2), ipu2 (Mk2 GC200), ipu21 (Bow).

Source of every number: the "IPU facts the simulator starts from" table of
docs/DESIGN.md (shared/DESIGN.md), which collects Graphcore's published
figures (the C2 card / GC2 processor for ipu1, the IPU-M2000 / GC200 datasheet
for ipu2, the Bow-2000 / Bow IPU datasheet for ipu21). Nothing here is
measured; the cost model calibrates against the anchors DESIGN.md lists.
Cross-check of the table (tests/config/test_targets.py): tiles x MACs x 2 x
clock gives the published peak fp16 throughput (125, 250, 350 TFLOP/s).
"""

import dataclasses

KiB = 1024
GB = 10**9

# Bulk-synchronous execution: "compute, sync (a few hundred cycles), exchange".
SYNC_CYCLES = 300


@dataclasses.dataclass(frozen=True)
class IPUTarget:
    name: str  # "ipu1", "ipu2", "ipu21": the values of ipu_model.version
    product: str
    tiles_per_ipu: int
    sram_bytes_per_tile: int
    clock_hz: float
    fp16_macs_per_tile_per_cycle: int
    fp32_macs_per_tile_per_cycle: int
    exchange_bytes_per_tile_per_cycle: int
    ipu_links: int  # 0: the table gives none for ipu1
    ipu_link_bytes_per_s: float  # all links of one IPU together; 0 when unknown
    host_link: str
    host_link_bytes_per_s: float  # 0 when the table gives no figure

    @property
    def sram_bytes_per_ipu(self):
        return self.tiles_per_ipu * self.sram_bytes_per_tile

    def peak_flops_per_ipu(self, dtype="float16"):
        """Peak FLOP/s of one IPU (a MAC is two FLOPs)."""
        macs = {
            "float16": self.fp16_macs_per_tile_per_cycle,
            "float32": self.fp32_macs_per_tile_per_cycle,
        }[str(dtype)]
        return 2.0 * macs * self.tiles_per_ipu * self.clock_hz

    def with_tiles(self, tiles):
        """The same IPU with fewer tiles (an IPU Model with ipu_model.tiles_per_ipu)."""
        return dataclasses.replace(self, tiles_per_ipu=int(tiles))


_GC200 = IPUTarget(
    name="ipu2",
    product="Mk2 GC200",
    tiles_per_ipu=1472,
    sram_bytes_per_tile=624 * KiB,
    clock_hz=1.33e9,
    fp16_macs_per_tile_per_cycle=64,
    fp32_macs_per_tile_per_cycle=16,
    exchange_bytes_per_tile_per_cycle=4,
    ipu_links=10,
    ipu_link_bytes_per_s=320 * GB,
    host_link="PCIe Gen4 x16",
    host_link_bytes_per_s=64 * GB,
)

TARGETS = {
    "ipu1": IPUTarget(
        name="ipu1",
        product="Mk1 GC2",
        tiles_per_ipu=1216,
        sram_bytes_per_tile=256 * KiB,
        clock_hz=1.6e9,
        fp16_macs_per_tile_per_cycle=32,
        fp32_macs_per_tile_per_cycle=8,
        exchange_bytes_per_tile_per_cycle=4,
        ipu_links=0,
        ipu_link_bytes_per_s=0.0,
        host_link="PCIe",
        host_link_bytes_per_s=0.0,
    ),
    "ipu2": _GC200,
    # Bow is the GC200 die (same tiles, SRAM, links) stacked on a power die
    # that clocks it faster: only its name, product and clock differ.
    "ipu21": dataclasses.replace(
        _GC200, name="ipu21", product="Bow", clock_hz=1.85e9
    ),
}

DEFAULT_TARGET = "ipu2"


def get_target(name):
    """The IPUTarget called `name`; ValueError listing the known ones otherwise."""
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unknown IPU version {name!r}: use one of {', '.join(map(repr, TARGETS))}."
        ) from None
