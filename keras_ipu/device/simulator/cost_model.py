"""The IPU cost model: every constant and formula the cycle and memory
predictions use, each with its source.

Sources, as cited below:
  [DESIGN]  the "IPU facts the simulator starts from" table of
            shared/DESIGN.md (tiles, SRAM, clock, MACs per tile per cycle,
            4 B per tile per cycle of exchange, PCIe, IPU-Links, BSP sync);
            the numbers themselves live in simulator/targets.py.
  [POPUTIL] Graphcore's poplibs, poputil/TileMapping.cpp:
            mapTensorLinearly's defaults (grain = the target's vector width,
            at least 128 bytes per tile).
  [TILE]    Graphcore's IPU Programmer's Guide: a tile's 64-bit data path
            (f32v2 / f16v4 vector instructions), six hardware worker threads.
  [POPOPS]  Graphcore's poplibs, popops/popopsCycleEstimators.cpp: the cycle
            estimates Poplar's own planners use for elementwise vertices
            (binaryOpInnerLoopCycles: per vector, the op's cycles plus 2 for
            load/store and the loop decision in the assembly codelets;
            basicOpSupervisorOverhead 198 cycles; 20 cycles of set-up per
            worker, each of the six workers taking 1/6 of the elements).
  [PCIE]    the PCI Express specification: Gen4 x16 moves about 32 GB/s in
            each direction (the 64 GB/s of [DESIGN] counts both directions).
  [TFREPORT] graphcore/tensorflow's documentation of the Poplar textual
            summary report: see "code memory" below.
  [TFMAP]   graphcore/tensorflow, compiler/plugin/poplar/driver/tools/
            mapping_helper.cc: see "tile mapping" below.
  [TFOFFLOAD] and [BOW2000]: see "streaming memory" and "reductions
            between processes" below.
  [TFFEED]  graphcore/tensorflow, compiler/plugin/poplar/driver/ops/
            feed_ops.cc: see "infeed and outfeed" below.
  [TFREPEAT] graphcore/tensorflow's while-loop-to-repeat pass: see
            "while loops" below.
  [TFFIFO]  graphcore/tensorflow, compiler/plugin/poplar/driver/passes/
            pipeline_fifo_inserter.cc and tools/pipeline_util.cc
            (GetFifoDepthMultiplier): see "pipeline stashes" below.
  [RING]    Patarasuk and Yuan's ring all-reduce (cited where used).
  [MPICH]   Thakur, Rabenseifner and Gropp's pairwise-exchange all-to-all
            (cited where used).
  assumption: a figure chosen here, not published; calibrate it against
            the anchors of [DESIGN] (ResNet-50 and BERT-Large on Bow Pod16).

Nothing in this module knows about the IR: it works on cost records
(keras_ipu/device/primitives/cost_util.Cost) and byte counts.
"""

import math

import numpy as np

from keras_ipu.device.simulator import targets

# -- tile mapping [POPUTIL] --------------------------------------------------
# mapTensorLinearly(graph, t): grainSize = target.getVectorWidth(type), i.e.
# the 64-bit data path divided by the element size: 8 bytes of any type.
DATA_PATH_BYTES = 8
# ... and minElementsPerTile = ceil(128 bytes / element size).
MIN_BYTES_PER_TILE = 128
# [TFMAP] Graphcore's TensorFlow backend maps a tensor linearly with
# poputil's mapping and then moves it cyclically to start at the tile after
# the previous linearly mapped tensor of the same graph
# (MapTensorLinearlyImpl: next_tile_to_map_from advances by the tensor's
# width, modulo the tiles), so small tensors spread over the IPU instead of
# piling up on tile 0; a tensor spread over every tile is not moved. (The
# later release in our sources rotates by the tensor's width instead of
# the running offset while still advancing the offset; the offset rule of
# the earlier release is the one its state exists for, and is taken here.)
# simulator/tile_mapping.py applies it in the order the program allocates.

# -- compute [DESIGN], [TILE] ------------------------------------------------
# Non-MAC arithmetic runs on the 64-bit vector unit: 2 float32 or 4 float16
# lanes per cycle [TILE]. Integer/bool ops are counted at the float32 rate.
VECTOR_BYTES_PER_TILE_PER_CYCLE = DATA_PATH_BYTES
# Fraction of the peak MAC rate [DESIGN] a matmul/convolution plan reaches on
# the tiles it uses (operand layout, partial sums, worker scheduling): an
# assumption. End-to-end anchors of [DESIGN] are ~18-23% of peak for whole
# training steps; the matmuls themselves run well above that.
MATMUL_EFFICIENCY = 0.5  # assumption
# Hardware worker contexts of a tile [TILE]; a supervisor vertex splits its
# work over all of them.
WORKER_CONTEXTS = 6
# Cycles to launch one compute set on a tile: the supervisor's overhead (198)
# plus each worker's set-up (20) times the six workers [POPOPS]. Taken for
# every kind of vertex (the convolution vertices' overheads in poplin's
# PerformanceEstimation.hpp are of the same order).
SUPERVISOR_OVERHEAD_CYCLES = 198  # [POPOPS]
WORKER_SETUP_CYCLES = 20  # [POPOPS]
VERTEX_OVERHEAD_CYCLES = SUPERVISOR_OVERHEAD_CYCLES + WORKER_CONTEXTS * WORKER_SETUP_CYCLES
# Elementwise vertices load their operands and store their result once per
# vector besides the arithmetic: 2 cycles per vector [POPOPS]. A fused chain
# (popops' map expressions) pays it once for the whole chain.
ELEMENTWISE_LOOP_OVERHEAD_CYCLES = 2  # [POPOPS]
# Vector FLOPs one transcendental (exp, log, tanh, erf, ...) costs per element
# (polynomial/Newton sequences on the vector unit): an assumption.
TRANSCENDENTAL_FLOPS = 8  # assumption
# Vector FLOPs to produce 32 random bits (the tile's hardware PRNG makes 64
# bits per cycle; conversion to the output type dominates): an assumption.
RANDOM_FLOPS_PER_32_BITS = 2  # assumption
# Vector FLOPs of a max pool's gradient (select_and_scatter_add) per window
# tap and window result: compare the tap with the result, select the
# cotangent or zero, add it into the operand's gradient. The ops of the
# per-tap decomposition it replaced (eq, select, the pads' add; the mask
# bookkeeping of ties not counted): an assumption.
POOL_GRAD_FLOPS_PER_TAP = 3  # assumption

# -- exchange and sync [DESIGN] ----------------------------------------------
EXCHANGE_BYTES_PER_TILE_PER_CYCLE = 4  # [DESIGN] (also targets.*.exchange_...)
SYNC_CYCLES = targets.SYNC_CYCLES  # [DESIGN]: "a few hundred cycles"; 300 taken
# Fraction of an op's input bytes that crosses the exchange, by cost kind:
# elementwise ops are mapped like their operands (no exchange), matmul/conv
# plans redistribute their operands to the tiles of the plan. Data
# rearrangements ("copy") move every byte they write instead (see
# exchange_bytes). An assumption about Poplar's planners.
EXCHANGE_FRACTION = {  # assumption
    "elementwise": 0.0,
    "view": 0.0,
    "copy": 0.0,  # + bytes_out
    "matmul": 1.0,
    "reduce": 0.0,  # partial results are exchanged: see exchange_bytes()
    "sort": 1.0,
    "linalg": 1.0,
    "fft": 1.0,
    "random": 0.0,
    "host": 1.0,
    "stream": 0.0,  # over the host link, not the exchange: stream_cycles()
}

# -- while loops [TFREPEAT] -----------------------------------------------------
# [TFREPEAT] graphcore/tensorflow, compiler/plugin/poplar/driver/
# while_loop_to_repeat_simplify.cc: a while loop whose trip count the
# compiler works out (a counter from a constant compared with a constant,
# WhileLoopUtil::CanConvertWhileToRepeat; else XLA's
# ComputeWhileLoopTripCount by brute force, up to
# TF_POPLAR_MAX_WHILE_LOOP_TRIP_COUNT trips, 128 by default) is recorded
# with its count, and the driver's CreateRepeatOp lowers it to
# poplar::program::Repeat(count, body): the body `count` times and the
# condition never (the loop's start and end copies are its carries' copies,
# which the memory model already holds). simulator/loop_trips.py counts
# them, by running the loop's control arithmetic as the brute force does,
# for loops of any length its pattern would accept: at most this many trips
# (a bound on the host time spent counting, about 15 us per trip, so about
# a second at most; not a Graphcore figure).
WHILE_LOOP_MAX_COUNTED_TRIPS = 1 << 16
# A while loop nothing can count (its bound read from an input or the data)
# stays a Poplar RepeatWhileTrue: the condition before every trip and once
# more. Its trips are only known at run time; the cost model counts its body
# this many times (and its condition once more). An assumption.
WHILE_LOOP_ASSUMED_TRIPS = 1  # assumption

# -- host and inter-IPU links [DESIGN], [PCIE] ---------------------------------
# One direction of the host link: half the two-way figure of [DESIGN] [PCIE].
HOST_LINK_DIRECTIONS = 2
# ipu1's row of [DESIGN] gives no PCIe figure: PCIe Gen3 x16, ~16 GB/s per
# direction, for the C2 card (assumption).
FALLBACK_HOST_BYTES_PER_S_PER_DIRECTION = 16e9  # assumption
# Latency of one host transfer (DMA set-up and the host sync): an assumption.
HOST_TRANSFER_LATENCY_S = 5e-6  # assumption

# -- infeed and outfeed [TFFEED] ------------------------------------------------
# [TFFEED] graphcore/tensorflow, compiler/plugin/poplar/driver/ops/feed_ops.cc:
# CreateInfeed makes a host-to-device FIFO of one element's size (its
# "bufferingDepth" option is the infeed's prefetch_depth: the data stream's
# buffers, on the host) and a program::Copy from it into the tensor of one
# element, at each dequeue; CreateOutfeed copies each enqueued element into a
# device-to-host FIFO the same way. So the IPU holds one element of a feed
# (simulator/feeds.py), not the batches of a whole execution.
FEED_ELEMENTS_ON_IPU = 1  # [TFFEED]

# -- code memory [TFREPORT] -----------------------------------------------------
# [TFREPORT] graphcore/tensorflow's "Retrieving information about the Poplar
# compilation and execution" (SDK 1.x documentation, "Reading the Poplar
# textual summary report"): the Memory Usage of a three-add program on one
# Mk1 IPU (1,216 tiles, 4 compute sets, three host-to-IPU streams and one
# back): Control Code 851,272 B, Host Exchange Code 351,328 B, Internal
# Exchange Code 60,792 B, Vertex Code 170,788 B (poprand's SetSeedSupervisor
# on every tile and two popops vertices on one or two). It is the only
# published breakdown of a Poplar program's code found (the Memory and
# Performance Optimisation guide, section 3.5, and the PopVision Graph
# Analyser guide name the categories without figures).
# What every tile holds whatever the program: the control program and the
# host exchange code of that smallest program, per tile
# (851,272 + 351,328) / 1,216 = 989 B [TFREPORT] (an upper bound: it
# includes that program's own four compute sets).
CONTROL_CODE_BYTES_PER_TILE = math.ceil((851_272 + 351_328) / 1_216)  # [TFREPORT]
# The code of one vertex type (codelet) on a tile that runs it: 170,788 B over
# 1,216 tiles = 141 B, nearly all poprand's SetSeedSupervisor on every tile
# [TFREPORT]. A small codelet; matmul/convolution codelets are larger, so
# this is low for those.
VERTEX_CODE_BYTES_PER_CODELET = math.ceil(170_788 / 1_216)  # [TFREPORT]
# Control code, sync and exchange code of one program step (one or a few
# compute sets and their exchanges) on each tile the step touches (the tiles
# holding its operands and results: they run its vertices or send and
# receive its exchanges; tile_mapping.Layout): an assumption. No published
# per-compute-set figure exists; a compute set's control code calls each of
# its vertices on the tile (a few 32/64-bit instructions each) and an
# exchange adds send/receive instructions per message.
CODE_BYTES_PER_STEP_PER_TILE = 64  # assumption


def _dtype(dtype):
    return np.dtype("float32") if dtype is None else np.dtype(dtype)


def is_half(dtype):
    d = _dtype(dtype)
    return d.itemsize == 2 and d.kind in "fV"  # float16 or bfloat16


def macs_per_tile_per_cycle(target, dtype):
    """[DESIGN]: fp16 (and bfloat16) vs fp32 MAC rate of one tile."""
    if is_half(dtype):
        return target.fp16_macs_per_tile_per_cycle
    return target.fp32_macs_per_tile_per_cycle


def vector_flops_per_tile_per_cycle(dtype):
    """[TILE]: lanes of the 64-bit vector unit (f16v4, f32v2); at least one."""
    itemsize = min(_dtype(dtype).itemsize, 4)
    return max(1, VECTOR_BYTES_PER_TILE_PER_CYCLE // max(itemsize, 2))


def linear_mapping(nbytes, itemsize, tiles):
    """[POPUTIL] mapTensorLinearly: (tiles used, bytes on the fullest tile).

    The tensor is cut into grains of DATA_PATH_BYTES, each tile takes
    max(ceil(grains / tiles), ceil(min bytes / grain)) grains, from tile 0 up
    (so tile 0 always holds the largest share).
    """
    if not nbytes:
        return 0, 0
    grain = max(DATA_PATH_BYTES, int(itemsize))
    grains = math.ceil(nbytes / grain)
    per_tile = max(math.ceil(grains / tiles), math.ceil(MIN_BYTES_PER_TILE / grain))
    used = math.ceil(grains / per_tile)
    return used, min(nbytes, per_tile * grain)


def tiles_used(nbytes, itemsize, tiles):
    return linear_mapping(nbytes, itemsize, tiles)[0]


def work_tiles(cost, target):
    """Tiles an op computes on: those its output spreads over [POPUTIL]; for
    matmuls and reductions the larger of output and input spread (Poplar's
    matmul plans split the contraction, reductions run where the input is)."""
    itemsize = _dtype(cost.dtype).itemsize
    tiles = target.tiles_per_ipu
    out = tiles_used(cost.bytes_out, itemsize, tiles)
    if cost.kind in ("matmul", "reduce"):
        out = max(out, tiles_used(cost.bytes_in, itemsize, tiles))
    return max(1, out)


def elementwise_vectors(cost, tiles):
    """Vectors (of the 64-bit data path [TILE]) an elementwise op writes on
    its busiest tile."""
    itemsize = _dtype(cost.dtype).itemsize
    elements = cost.bytes_out // max(1, itemsize)
    lanes = vector_flops_per_tile_per_cycle(cost.dtype)
    return math.ceil(elements / (max(1, tiles) * lanes))


def compute_cycles(cost, target, tiles=None):
    """Cycles of the compute phase on the busiest tile.

    matmul kind: macs / (tiles x MACs per tile per cycle [DESIGN] x
    MATMUL_EFFICIENCY); others: flops / (tiles x vector lanes [TILE]);
    elementwise: plus ELEMENTWISE_LOOP_OVERHEAD_CYCLES per output vector
    [POPOPS]; plus VERTEX_OVERHEAD_CYCLES when there is any work.
    """
    if not cost.flops and not cost.macs:
        return 0
    tiles = work_tiles(cost, target) if tiles is None else tiles
    if cost.macs:
        rate = macs_per_tile_per_cycle(target, cost.dtype) * MATMUL_EFFICIENCY
        cycles = math.ceil(cost.macs / (tiles * rate))
        extra = max(0, cost.flops - 2 * cost.macs)  # epilogue vector work
    else:
        cycles, extra = 0, cost.flops
    if extra:
        cycles += math.ceil(extra / (tiles * vector_flops_per_tile_per_cycle(cost.dtype)))
    if cost.kind == "elementwise":
        cycles += ELEMENTWISE_LOOP_OVERHEAD_CYCLES * elementwise_vectors(cost, tiles)
    return cycles + VERTEX_OVERHEAD_CYCLES


def exchange_bytes(cost, target, tiles=None):
    """Bytes an op moves over the exchange (EXCHANGE_FRACTION, an assumption);
    a copy moves what it writes; a reduction exchanges one partial result
    per tile it runs on."""
    moved = cost.bytes_in * EXCHANGE_FRACTION.get(cost.kind, 1.0)
    if cost.kind == "copy":
        moved += cost.bytes_out
    if cost.kind == "reduce":
        tiles = work_tiles(cost, target) if tiles is None else tiles
        moved += min(cost.bytes_in, tiles * cost.bytes_out) if tiles > 1 else 0
    return int(moved)


def exchange_cycles(nbytes, tiles, target=None):
    """[DESIGN]: each tile receives 4 bytes per cycle; `nbytes` spread over
    `tiles` receivers."""
    if not nbytes:
        return 0
    rate = EXCHANGE_BYTES_PER_TILE_PER_CYCLE
    if target is not None:
        rate = target.exchange_bytes_per_tile_per_cycle
    return math.ceil(nbytes / (max(1, tiles) * rate))


def sync_cycles(n_steps=1):
    """[DESIGN]: one sync per bulk-synchronous step."""
    return SYNC_CYCLES * n_steps


def host_bytes_per_s(target):
    """One direction of the host link ([DESIGN] two-way figure / 2 [PCIE])."""
    if target.host_link_bytes_per_s:
        return target.host_link_bytes_per_s / HOST_LINK_DIRECTIONS
    return FALLBACK_HOST_BYTES_PER_S_PER_DIRECTION


def host_transfer_seconds(nbytes, target):
    """Infeed/outfeed time over PCIe: latency + bytes / one-way bandwidth."""
    if not nbytes:
        return 0.0
    return HOST_TRANSFER_LATENCY_S + nbytes / host_bytes_per_s(target)


# The infeed's prefetch [assumption]: with prefetch_depth >= 2 the host
# streams the next batches while the IPU computes (IPUInfeedQueue's
# prefetch), so transfers overlap the device time and a step takes the
# longer of the two; without it (depth None or 1) they add up.
def overlapped_host_seconds(device_seconds, host_seconds, prefetch_depth=None):
    if prefetch_depth is not None and prefetch_depth >= 2:
        return max(device_seconds, host_seconds)
    return device_seconds + host_seconds


def stream_cycles(nbytes, target):
    """Cycles the IPU spends on a data stream inside a program (an infeed
    read, an outfeed write, a host region's transfers): the host transfer
    of `nbytes` in the IPU's clock."""
    if not nbytes:
        return 0
    return math.ceil(host_transfer_seconds(nbytes, target) * target.clock_hz)


def ipu_link_seconds(nbytes, target):
    """Inter-IPU copy over IPU-Links [DESIGN] (all links of one IPU)."""
    if not nbytes:
        return 0.0
    if not target.ipu_link_bytes_per_s:
        raise ValueError(
            f"{target.name} has no IPU-Link bandwidth in the target table: "
            "inter-IPU copies cannot be costed on it."
        )
    return nbytes / target.ipu_link_bytes_per_s


# -- multi-IPU programs (sharding, pipelining) [DESIGN] ------------------------
# A copy between IPUs is a bulk-synchronous step of its own: every IPU of the
# program syncs over the IPU-Links before the exchange. Cycles of that global
# sync: an assumption (an on-chip sync is "a few hundred cycles" [DESIGN];
# one that crosses chips waits for the links as well: taken as 3x).
INTER_IPU_SYNC_CYCLES = 3 * SYNC_CYCLES  # assumption


def ipu_link_cycles(nbytes, target):
    """Cycles (of the receiving IPU's clock) of an inter-IPU copy of `nbytes`
    over the IPU-Links of [DESIGN], plus the global sync; 0 for no bytes."""
    if not nbytes:
        return 0
    return math.ceil(ipu_link_seconds(nbytes, target) * target.clock_hz) + INTER_IPU_SYNC_CYCLES


# -- collectives across replicas [DESIGN], [RING] -------------------------------
# [RING] P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms
# for clusters of workstations", J. Parallel Distrib. Comput. 69 (2009): the
# ring all-reduce of n bytes over k members moves 2 (k - 1) / k x n bytes in
# and out of each member, in 2 (k - 1) steps (reduce-scatter, all-gather).
# Graphcore's collectives run rings over the IPU-Links; taken here at the
# full link bandwidth of [DESIGN] (an assumption: GCL spreads its rings over
# all links), each step ending with a sync across the IPUs
# (INTER_IPU_SYNC_CYCLES).


def all_reduce_link_traffic(nbytes, replicas):
    """[RING]: (bytes each IPU sends, synchronised steps) of an all-reduce
    of `nbytes` over `replicas` IPUs (or groups of replicas)."""
    k = int(replicas)
    if k <= 1 or not nbytes:
        return 0, 0
    return math.ceil(2 * (k - 1) * nbytes / k), 2 * (k - 1)


def reduce_scatter_link_traffic(nbytes, replicas):
    """[RING]: (bytes each IPU sends, synchronised steps) of a
    reduce-scatter of `nbytes` (each member's operand) over `replicas`
    IPUs: the first half of the ring all-reduce, (k - 1) / k x n bytes in
    k - 1 steps."""
    k = int(replicas)
    if k <= 1 or not nbytes:
        return 0, 0
    return math.ceil((k - 1) * nbytes / k), k - 1


def all_gather_link_traffic(nbytes, replicas):
    """[RING]: (bytes each IPU sends, synchronised steps) of an all-gather
    whose gathered result is `nbytes`: the second half of the ring
    all-reduce, (k - 1) / k x n bytes in k - 1 steps."""
    return reduce_scatter_link_traffic(nbytes, replicas)


# [MPICH] R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of
# collective communication operations in MPICH", Int. J. High Perform.
# Comput. Appl. 19 (2005): the pairwise-exchange all-to-all of k members
# takes k - 1 steps, in each a member sends one of its k blocks (n / k
# bytes) to another member.


def all_to_all_link_traffic(nbytes, replicas):
    """[MPICH]: (bytes each IPU sends, synchronised steps) of an all-to-all
    of `nbytes` per member over `replicas` IPUs: (k - 1) / k x n bytes in
    k - 1 steps."""
    return reduce_scatter_link_traffic(nbytes, replicas)


def permute_link_traffic(nbytes, sends):
    """(bytes an IPU sends, synchronised steps) of a collective permute:
    every source sends its whole operand to its target at once, one step
    ([DESIGN]'s exchange over the IPU-Links); nothing when `sends` is
    False (no replica sends)."""
    if not sends or not nbytes:
        return 0, 0
    return int(nbytes), 1


def collective_link_cycles(link_bytes, link_steps, target):
    """(link cycles, sync cycles) of a collective's traffic: bytes over the
    IPU-Links [DESIGN], one global sync per ring step."""
    if not link_steps:
        return 0, 0
    return (math.ceil(ipu_link_seconds(link_bytes, target) * target.clock_hz),
            link_steps * INTER_IPU_SYNC_CYCLES)


# -- streaming memory (remote buffers) [TFOFFLOAD], [BOW2000] -------------------
# [TFOFFLOAD] graphcore/tensorflow, compiler/plugin/poplar/driver/passes/
#             variables_offload_and_partition.cc: a variable only the weight
#             update reads and writes (an optimizer slot) lives in a remote
#             buffer when offloaded; the weight update loads it (with
#             replicated sharding: this replica's 1/r of the elements, padded,
#             then an all-gather across the r replicas), updates it, and
#             stores it back (with sharding: its own 1/r, sliced out by a
#             "LOCAL" reduce-scatter that moves no data). A variable smaller
#             than IPUConfig.optimizations.minimum_remote_tensor_size (times r
#             when sharded) stays on the IPU.
# [BOW2000] (below): the IPU-Machine's Streaming Memory, "up to 256GB".
# No Graphcore figure for the Streaming Memory's bandwidth per IPU is in our
# sources: it is taken as the host link's one-way rate of [DESIGN] [PCIE]
# (an assumption; the DDR sits behind the machine's gateway, not on PCIe).


def streaming_memory_seconds(nbytes, target):
    """Moving `nbytes` between an IPU and Streaming Memory (one direction)."""
    if not nbytes:
        return 0.0
    return nbytes / host_bytes_per_s(target)


def replica_shard_bytes(nbytes, itemsize, replicas):
    """[TFOFFLOAD]: bytes of one replica's shard of an `nbytes` tensor of
    `itemsize`-byte elements partitioned over `replicas` (the element count
    rounded up to a multiple of `replicas`: the store pads it)."""
    r = max(1, int(replicas))
    elements = math.ceil(nbytes / max(1, int(itemsize)))
    return math.ceil(elements / r) * int(itemsize)


def offloaded_update_cycles(shard_bytes, full_bytes, replicas, target):
    """[TFOFFLOAD]: cycles the weight update spends on offloaded optimizer
    state per step: load this replica's shard (`shard_bytes`, all of it
    when not sharded) from Streaming Memory and store it back, plus, when
    sharded over `replicas`, the all-gather of the `full_bytes` over the
    IPU-Links (collective_link_cycles)."""
    if not shard_bytes:
        return 0
    stream = math.ceil(2 * streaming_memory_seconds(shard_bytes, target) * target.clock_hz)
    links, syncs = collective_link_cycles(*all_gather_link_traffic(full_bytes, replicas), target)
    return stream + links + syncs


# -- pipeline stashes [TFFIFO] ----------------------------------------------------
# PipelineFIFOInserter puts a FIFO between each forward stage and its own
# backward stage for the forward values the backward stage reads, of depth
# multiplier x (last stage id - stage id), the stage ids counting every
# stage of the pipeline in order (not IPUs: two stages on one IPU have two
# ids); the multiplier is GetFifoDepthMultiplier's: Grouped 2, Interleaved
# 1, Sequential 0 (no FIFO). A stage holds its FIFO's micro-batches plus
# the one it is working on.
PIPELINE_FIFO_DEPTH_MULTIPLIER = {"Grouped": 2, "Interleaved": 1, "Sequential": 0}  # [TFFIFO]


def pipeline_stage_in_flight(schedule, stage, n_stages):
    """[TFFIFO]: micro-batches whose forward values stage `stage` (its
    position 0..n_stages-1 in the pipeline) holds at once under `schedule`:
    its FIFO's depth plus the one in its stage."""
    return PIPELINE_FIFO_DEPTH_MULTIPLIER[schedule] * (n_stages - 1 - stage) + 1


def pipeline_utilisation(gradient_accumulation_count, n_stages):
    """[DESIGN]: about g / (g + n - 1) of a pipeline of n balanced stages
    over g micro-batches (the fill and drain of the pipeline idle the IPUs)."""
    g, n = int(gradient_accumulation_count), int(n_stages)
    return g / (g + n - 1)


def cycles_to_seconds(cycles, target):
    return cycles / target.clock_hz


# -- reductions between processes and between Pods (data parallelism) ---------
# The ring of [RING] (above) between hosts or Pods instead of IPUs.
# Sources:
#   [BOW2000] Graphcore, Bow-2000 IPU-Machine datasheet: 4 IPUs per machine;
#             "GW-Link - 2x 100Gbps Gateway-Links for communication between
#             Bow Pods"; "Host-Link - PCIe Gen4 RoCEv2 NIC/SmartNIC Interface".
#   [PODDA]   Graphcore, IPU-POD DA build and test guide: the host server
#             connects through "1x 100GbE RoCEv2 NIC".
#   [POD64]   Graphcore, IPU-POD64 build and test guide: the 64 IPUs of a Pod
#             are joined by IPU-Links; the IPU-Gateway "enables IPU scaleout
#             across 100GbE (IPU-GW-link) for rack-to-rack connectivity".
#   [HOROVOD] Horovod's allreduce (and so ipu.distributed.allreduce, reference
#             21.10, "a bandwidth-optimal ring allreduce") is the ring of [RING].
GW_LINK_BYTES_PER_S = 100e9 / 8  # one GW-Link, one direction [BOW2000]
GW_LINKS_PER_MACHINE = 2  # [BOW2000]
IPUS_PER_MACHINE = 4  # [BOW2000]
HOST_NIC_BYTES_PER_S = 100e9 / 8  # the host's 100 GbE RoCE NIC, one direction [PODDA]
IPU_LINK_DOMAIN_IPUS = 64  # IPUs joined by IPU-Links: one Pod64 [POD64]
# One step of a ring over the network: a RoCE message and MPI's software
# around it (assumption; RoCE itself takes a few microseconds).
NETWORK_STEP_LATENCY_S = 10e-6  # assumption


def network_allreduce_seconds(nbytes, participants, bytes_per_s):
    """[RING] over a network: each of the 2 (p - 1) steps pays
    NETWORK_STEP_LATENCY_S, and each participant sends 2 (p - 1) / p x n bytes."""
    link_bytes, steps = all_reduce_link_traffic(nbytes, participants)
    return steps * NETWORK_STEP_LATENCY_S + link_bytes / bytes_per_s


def gateway_allreduce_seconds(nbytes, pods, ipus_per_pod=IPU_LINK_DOMAIN_IPUS):
    """The all-reduce of `nbytes` (already reduced inside each Pod) between
    `pods` Pods over their GW-Links [BOW2000]: a ring [RING] whose links are
    all the Pod's machines' GW-Links together."""
    machines = max(1, int(ipus_per_pod) // IPUS_PER_MACHINE)
    bandwidth = machines * GW_LINKS_PER_MACHINE * GW_LINK_BYTES_PER_S
    return network_allreduce_seconds(nbytes, pods, bandwidth)


def host_allreduce_seconds(nbytes, instances, target):
    """A reduction of `nbytes` per instance on the hosts ([HOROVOD]:
    ipu.distributed.allreduce, IPUHorovodStrategy, IPUMultiWorkerStrategy,
    a PopDist reduction on the CPU): the tensor comes from the IPU over the
    host link, the hosts' NICs run the ring [RING][PODDA], and the result
    goes back."""
    if int(instances) <= 1 or not nbytes:
        return 0.0
    ring = network_allreduce_seconds(nbytes, instances, HOST_NIC_BYTES_PER_S)
    return 2 * host_transfer_seconds(nbytes, target) + ring


def ipu_link_allreduce_seconds(nbytes, replicas, target):
    """The compiled all-reduce of `nbytes` between `replicas` IPUs over the
    IPU-Links (all_reduce_link_traffic, collective_link_cycles)."""
    links, syncs = collective_link_cycles(*all_reduce_link_traffic(nbytes, replicas), target)
    return cycles_to_seconds(links + syncs, target)


def data_parallel_reduction_seconds(nbytes, replicas, target, ipus_per_replica=1):
    """The gradient all-reduce of one training step of `replicas` replicas
    (of `ipus_per_replica` IPUs each) as GCL compiles it for PopDistStrategy:
    over the IPU-Links inside each Pod64, then over the GW-Links between
    Pods."""
    replicas, k = int(replicas), int(ipus_per_replica)
    per_pod = max(1, min(replicas, IPU_LINK_DOMAIN_IPUS // k))
    pods = math.ceil(replicas / per_pod)
    return ipu_link_allreduce_seconds(nbytes, per_pod, target) + gateway_allreduce_seconds(
        nbytes, pods, per_pod * k
    )


def cross_instance_reduction_seconds(nbytes, local_replicas, instances, target, on_hosts=False):
    """What a compiled all-reduce of `nbytes` over `local_replicas` replicas
    adds when `instances` processes share the job: with GCL
    (PopDistStrategy) the ring spans every replica (IPU-Links, then GW-Links
    between Pods) instead of the local ones; on the hosts
    (IPUHorovodStrategy, IPUMultiWorkerStrategy: the all-reduce taken out
    of the compiled program, [HOROVOD]) the local result goes to the host
    and through host_allreduce_seconds."""
    if int(instances) <= 1 or not nbytes:
        return 0.0
    if on_hosts:
        return host_allreduce_seconds(nbytes, instances, target)
    return data_parallel_reduction_seconds(
        nbytes, local_replicas * instances, target
    ) - ipu_link_allreduce_seconds(nbytes, local_replicas, target)
