"""The simulated IPU system: a Pod of IPUs, its device configurations, and the
TensorFlow-style devices (/device:IPU:N) a configuration selects from it.

Topology. The IPUs of a Pod sit on a ladder: rung k holds ladder positions 2k
and 2k+1 (linked to each other), and position p is linked to p+2 (the rung
above). A multi-IPU device is an aligned block of 2, 4, 8 ... consecutive
ladder positions; its members are listed in ladder order (gc-info's "DNC Id").
Single-IPU devices are numbered by PCIe id, which need not follow the ladder:
for 16 IPUs the mapping is the one of the reference's `gc-info -l` listing,
so device ids 0..30 and their member lists match it exactly.

Shards of a multi-IPU device map to its members through the SelectionOrder
(shard_order), as the reference's 16-IPU diagram shows.
"""

import dataclasses
import enum
import re
from typing import NamedTuple

from keras_ipu.device.enums import DeviceConnectionType, SelectionOrder
from keras_ipu.device.simulator import targets

# Ladder position -> PCIe id of the 16-IPU system of the reference's listing
# (the member list of its 16-IPU device, Id 30).
_POD16_LADDER = (5, 7, 4, 6, 3, 1, 2, 0, 13, 15, 12, 14, 9, 11, 10, 8)
# PCI domain of each PCIe id in that listing.
_POD16_PCI = (
    "0000:1a:00.0", "0000:1b:00.0", "0000:23:00.0", "0000:24:00.0",
    "0000:3d:00.0", "0000:3e:00.0", "0000:43:00.0", "0000:44:00.0",
    "0000:8b:00.0", "0000:8c:00.0", "0000:8e:00.0", "0000:8f:00.0",
    "0000:b8:00.0", "0000:b9:00.0", "0000:ba:00.0", "0000:bb:00.0",
)  # fmt: skip

DEFAULT_POD_SIZE = 16


def is_power_of_two(n):
    return n >= 1 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True)
class DeviceConfiguration:
    """One entry of the device listing: its id and member IPUs (PCIe ids, ladder order)."""

    id: int
    ipus: tuple
    ladder_positions: tuple

    @property
    def num_ipus(self):
        return len(self.ipus)


class Pod:
    """A Pod of `num_ipus` IPUs (a power of two) and its device configurations."""

    def __init__(self, num_ipus=DEFAULT_POD_SIZE):
        if not (isinstance(num_ipus, int) and is_power_of_two(num_ipus)):
            raise ValueError(f"A Pod has a power-of-two number of IPUs, got {num_ipus!r}.")
        self.num_ipus = num_ipus
        if num_ipus == 16:
            self.ladder = _POD16_LADDER
            self.pci_domains = _POD16_PCI
        else:
            self.ladder = tuple(range(num_ipus))
            self.pci_domains = tuple(f"0000:{0x1a + i:02x}:00.0" for i in range(num_ipus))
        self._position = {ipu: pos for pos, ipu in enumerate(self.ladder)}
        configs = [DeviceConfiguration(i, (i,), (self._position[i],)) for i in range(num_ipus)]
        size = 2
        while size <= num_ipus:
            for base in range(0, num_ipus, size):
                positions = tuple(range(base, base + size))
                configs.append(
                    DeviceConfiguration(
                        len(configs), tuple(self.ladder[p] for p in positions), positions
                    )
                )
            size *= 2
        self.configurations = tuple(configs)

    def ladder_position(self, ipu):
        return self._position[ipu]

    def linked(self, ipu_a, ipu_b):
        """Whether two IPUs (PCIe ids) are directly connected by IPU-Links."""
        a, b = self._position[ipu_a], self._position[ipu_b]
        return a != b and (a ^ 1 == b or abs(a - b) == 2)

    def listing(self):
        """The device listing, in the format of `gc-info -l`."""
        lines = ["Graphcore device listing:", ""]
        for cfg in self.configurations:
            if cfg.num_ipus == 1:
                ipu = cfg.ipus[0]
                lines.append(
                    f"-+- Id: {f'[{cfg.id}]':>4}, type:      [PCIe], "
                    f"PCI Domain: [{self.pci_domains[ipu]}]"
                )
                continue
            lines.append(f"-+- Id: {f'[{cfg.id}]':>4}, type: [Multi IPU]")
            for dnc, ipu in enumerate(cfg.ipus):
                lines.append(
                    f"|--- PCIe Id: {f'[{ipu}]':>4}, DNC Id: [{dnc}], "
                    f"PCI Domain: [{self.pci_domains[ipu]}]"
                )
        return "\n".join(lines)


def shard_order(selection_order, num_ipus, ring=False):
    """Ladder positions, within a device of `num_ipus`, of shards 0, 1, ...

    AUTO picks for the program: HOOF when its shards talk in a ring (last to
    first), otherwise SNAKE (every consecutive pair of shards linked), which
    is never worse than ZIGZAG for a chain of shards.
    """
    n = num_ipus
    if selection_order == SelectionOrder.AUTO:
        selection_order = SelectionOrder.HOOF if ring else SelectionOrder.SNAKE
    if n <= 2 or selection_order == SelectionOrder.ZIGZAG:
        return tuple(range(n))
    if selection_order == SelectionOrder.SNAKE:
        # Left to right on even rungs, right to left on odd rungs.
        return tuple(p if (p // 2) % 2 == 0 else p ^ 1 for p in range(n))
    if selection_order == SelectionOrder.HOOF:
        # Up the left rail, down the right rail.
        return tuple(range(0, n, 2)) + tuple(range(n - 1, 0, -2))
    raise ValueError(f"Unknown SelectionOrder {selection_order!r}.")


@dataclasses.dataclass(frozen=True)
class IPUDevice:
    """A TensorFlow-style device /device:IPU:<index> controlling one configuration."""

    index: int
    configuration: DeviceConfiguration

    @property
    def name(self):
        return f"/device:IPU:{self.index}"

    @property
    def num_ipus(self):
        return self.configuration.num_ipus

    @property
    def ipus(self):
        return self.configuration.ipus

    def shard_ipus(self, selection_order, num_shards=None, ring=False):
        """The IPU (PCIe id) of each shard 0..num_shards-1."""
        num_shards = self.num_ipus if num_shards is None else num_shards
        if num_shards > self.num_ipus:
            raise ValueError(
                f"{num_shards} shards do not fit on {self.name}, which has "
                f"{self.num_ipus} IPUs: select a device with more IPUs "
                "(IPUConfig.auto_select_ipus) or use fewer shards."
            )
        order = shard_order(selection_order, self.num_ipus, ring)
        return tuple(self.ipus[p] for p in order[:num_shards])


    def replication_factor(self, num_shards):
        """How many replicas of a `num_shards`-IPU program this device runs
        (`num_shards` as rounded_shards gives it)."""
        if num_shards < 1 or self.num_ipus % num_shards:
            # Graphcore's compiler's words first (poplar_compiler.cc), then ours.
            raise ValueError(
                f"Trying to compile a graph for an IPU device with {self.num_ipus} IPUs "
                f"and {num_shards} shards. The number of shards needs to divide the "
                f"number of IPUs. {self.name} has {self.num_ipus} IPUs, which is not a "
                f"multiple of the program's {num_shards} shards: each replica needs "
                f"{num_shards} IPUs. Select a device of k x {num_shards} IPUs "
                "(IPUConfig.auto_select_ipus)."
            )
        return self.num_ipus // num_shards

    def replica_shard_ipus(self, num_shards, selection_order, ring=False):
        """The IPUs of each replica, shard by shard.

        Replica r takes the aligned block of ladder positions [r*s, (r+1)*s) for
        s = num_shards, and its shards follow the selection order in that block.
        """
        replicas = self.replication_factor(num_shards)
        order = shard_order(selection_order, num_shards, ring)
        return tuple(
            tuple(self.ipus[r * num_shards + p] for p in order) for r in range(replicas)
        )


def auto_select(pod, sizes):
    """Devices of the given IPU counts, without shared IPUs (first fit).

    Larger requests are placed first: with aligned power-of-two blocks that
    never fails when the IPUs suffice, whatever order the sizes come in.
    """
    sizes = [sizes] if isinstance(sizes, int) else list(sizes)
    for i, n in enumerate(sizes):
        name = f"auto_select_ipus[{i}]" if len(sizes) > 1 else "auto_select_ipus"
        if not isinstance(n, int) or n < 1:
            raise ValueError(
                f"{name} = {n!r}: a device has at least 1 IPU. Set "
                "config.auto_select_ipus to the number of IPUs each device "
                f"needs: 1, 2, 4, ... up to the {pod.num_ipus} of this system."
            )
        if n > pod.num_ipus:
            raise ValueError(
                f"{name} = {n} asks for a device of {n} IPUs, but the system "
                f"has {pod.num_ipus} IPUs (the simulated Pod). Ask for at most "
                f"{pod.num_ipus}."
            )
        if not is_power_of_two(n):
            larger = 1 << n.bit_length()
            fits = (f"round it up to {larger}" if larger <= pod.num_ipus
                    else f"round it down to {larger // 2}")
            raise ValueError(
                f"{name} = {n}: a device has 1, 2, 4, 8, ... IPUs (a power of "
                f"two); {fits}."
            )
    total = sum(sizes)
    if total > pod.num_ipus:
        raise ValueError(
            f"auto_select_ipus = {sizes} asks for {total} IPUs in all, but the system "
            f"has {pod.num_ipus} IPUs. Use fewer or smaller devices."
        )
    used = set()
    chosen = [None] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        for cfg in pod.configurations:
            if cfg.num_ipus == sizes[i] and used.isdisjoint(cfg.ipus):
                chosen[i] = cfg
                used.update(cfg.ipus)
                break
        else:  # unreachable for power-of-two sizes that fit; kept as a guard
            raise ValueError(f"No free device of {sizes[i]} IPUs for auto_select_ipus={sizes}.")
    return tuple(IPUDevice(i, cfg) for i, cfg in enumerate(chosen))


def select(pod, ids):
    """Devices from explicit configuration ids of the device listing."""
    ids = [ids] if isinstance(ids, int) else list(ids)
    last = len(pod.configurations) - 1
    owner = {}
    devices = []
    for i, cfg_id in enumerate(ids):
        if not (isinstance(cfg_id, int) and 0 <= cfg_id <= last):
            raise ValueError(
                f"select_ipus[{i}] = {cfg_id!r} is not a device id of this "
                f"{pod.num_ipus}-IPU system: ids go from 0 to {last} "
                "(keras_ipu.utils.device_listing() prints them)."
            )
        cfg = pod.configurations[cfg_id]
        for ipu in cfg.ipus:
            if ipu in owner:
                raise ValueError(
                    f"select_ipus = {ids}: devices {owner[ipu]} and {cfg_id} share IPU "
                    f"{ipu}. Choose device ids whose IPUs do not overlap."
                )
            owner[ipu] = cfg_id
        devices.append(IPUDevice(i, cfg))
    return tuple(devices)


class FPBehaviour(NamedTuple):
    """The floating_point_behaviour a system sets and an executable is
    compiled for (hashable, picklable; set_all already applied). esr is the
    StochasticRoundingBehaviour member's name: "OFF", "ON" or
    "REPLICA_IDENTICAL_ONLY". simulator/numerics.py gives it its effects."""

    inv: bool = False
    div0: bool = False
    oflo: bool = False
    esr: str = "OFF"
    nanoo: bool = False

    @property
    def traps(self):
        return self.inv or self.div0 or self.oflo

    @property
    def stochastic_rounding(self):
        return self.esr != "OFF"

    @property
    def active(self):
        """Whether it turns anything on (the compiler then wraps the kernels;
        otherwise they run untouched)."""
        return self != DEFAULT_BEHAVIOUR


DEFAULT_BEHAVIOUR = FPBehaviour()


def _esr_name(esr):
    if isinstance(esr, enum.Enum):
        return esr.name
    if isinstance(esr, str):
        return esr.upper()
    return "ON" if esr else "OFF"  # the deprecated bool form


def behaviour_from_dict(fp):
    """FPBehaviour from IPUSystem.floating_point (a dict; empty = defaults)."""
    fp = fp or {}
    return FPBehaviour(
        inv=bool(fp.get("inv", False)),
        div0=bool(fp.get("div0", False)),
        oflo=bool(fp.get("oflo", False)),
        esr=_esr_name(fp.get("esr", "OFF")),
        nanoo=bool(fp.get("nanoo", False)),
    )


@dataclasses.dataclass
class IPUSystem:
    """The configured system: what the compiler and executor consult."""

    config: object  # the IPUConfig it was made from (a private copy)
    flags: object  # keras_ipu.device.flags.PoplarFlags
    pod: Pod
    target: targets.IPUTarget  # per IPU, with the tile count in use
    ipu_model: bool  # True: the IPU Model; False: (simulated) hardware
    devices: tuple
    connection: DeviceConnectionType
    num_io_tiles: int = 0
    # inv, div0, oflo, nanoo (bools) and esr (StochasticRoundingBehaviour),
    # with floating_point_behaviour.set_all already applied.
    floating_point: dict = dataclasses.field(default_factory=dict)
    is_default: bool = False
    attached: bool = False
    seeds: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.connection == DeviceConnectionType.ALWAYS:
            self.attached = True

    @property
    def fp_behaviour(self):
        """The FPBehaviour of `floating_point`."""
        return behaviour_from_dict(self.floating_point)

    @property
    def tiles_per_ipu(self):
        return self.target.tiles_per_ipu

    @property
    def compute_tiles_per_ipu(self):
        return self.target.tiles_per_ipu - self.num_io_tiles

    @property
    def executes(self):
        """False when programs only compile (PRE_COMPILE and NEVER)."""
        return self.connection in (DeviceConnectionType.ALWAYS, DeviceConnectionType.ON_DEMAND)

    def device(self, name="/device:IPU:0"):
        """The IPUDevice called `name` ("/device:IPU:1", "IPU:1" or 1)."""
        index = _device_index(name)
        if index is None or index >= len(self.devices):
            known = ", ".join(d.name for d in self.devices)
            raise ValueError(
                f"No IPU device {name!r} in the configured system (devices: {known}). "
                "Select more devices with IPUConfig.auto_select_ipus or select_ipus."
            )
        return self.devices[index]

    def attach(self):
        """Called before an executable runs: what running means for this connection.

        Returns "run" (compute values) or "zeros" (PRE_COMPILE: outputs are all
        zeros); raises for NEVER, which can compile but never run.
        """
        if self.connection == DeviceConnectionType.NEVER:
            raise RuntimeError(
                "The IPU system is configured with device_connection.type = "
                "DeviceConnectionType.NEVER: programs compile but cannot run. Use "
                "ALWAYS or ON_DEMAND to run them."
            )
        if self.connection == DeviceConnectionType.PRE_COMPILE:
            return "zeros"
        self.attached = True
        return "run"

    def describe(self):
        kind = "IPU Model" if self.ipu_model else "IPU system (simulated hardware)"
        lines = [
            f"{kind}: {self.target.name} ({self.target.product}), "
            f"{self.tiles_per_ipu} tiles per IPU, Pod of {self.pod.num_ipus} IPUs, "
            f"connection {self.connection.name}"
        ]
        for d in self.devices:
            lines.append(
                f"  {d.name}: {d.num_ipus} IPU(s) {list(d.ipus)} "
                f"(device id {d.configuration.id})"
            )
        return "\n".join(lines)

    __str__ = describe


_DEVICE_NAME = re.compile(r"(?:^|/)(?:device:)?IPU:(\d+)$", re.IGNORECASE)


def _device_index(name):
    """0 from 0, "IPU:0", "/device:IPU:0" or "/job:localhost/.../device:IPU:0"."""
    if isinstance(name, int) and not isinstance(name, bool):
        return name if name >= 0 else None
    if not isinstance(name, str):
        return None
    match = _DEVICE_NAME.search(name.strip())
    return int(match.group(1)) if match else None


def rounded_shards(num_shards):
    """The IPUs one replica of a program spanning IPUs 0..num_shards-1
    takes: Graphcore's compiler rounds the highest shard + 1 up to a power
    of two (poplar_compiler NumIPUsInShards), so a 3-stage pipeline takes 4
    IPUs and runs 1 replica on 4 or 8 / 4 = 2 on 8."""
    if num_shards <= 1:
        return 1
    return 1 << (int(num_shards) - 1).bit_length()
