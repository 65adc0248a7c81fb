"""`CUDA_VISIBLE_DEVICES` read the way CUDA reads it, and the grant it makes: the GPUs a process
was started with, placed on NVML's cards (with a Slurm job's record, `gpus.slurm`, where the process
runs in one), and the catalog that keeps a policy inside them (pure: the inventory and environment
are given; only where an NVIDIA driver is present may `grant_of` ask CUDA's numbering of a child,
`gpus.cudaprobe`)."""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from ..errors import PolicyError
from ..language.policy import MAX_WHOLE, is_uuid, short_uuid, whole_number
from . import cudaprobe
from .inventory import Gpu, Inventory, InventoryCatalog, freest_first
from .slurm import SlurmGrant, slurm_grant

_BLANKS = " \t"
"""What CUDA skips around an entry; a newline is not among them (`GPU-abc\n` is no UUID)."""


class CudaVisible(NamedTuple):
    """The entries CUDA will use, and the first entry it stopped at (everything after is ignored)."""

    raw: str | None
    entries: tuple[str, ...] = ()
    stopped_at: str | None = None

    @property
    def restricts(self) -> bool:
        return self.raw is not None

    @property
    def hides_all(self) -> bool:
        return self.raw is not None and not self.entries


def parse_cuda_visible(raw: str | None, known: set[str] | None = None) -> CudaVisible:
    """Parse like CUDA: indices, GPU/MIG UUIDs or prefixes; stop at the first invalid entry;
    an empty value hides every GPU. `known` (indices and UUIDs that exist), when given, also makes
    an index or UUID that does not exist invalid."""
    if raw is None:
        return CudaVisible(None)
    entries: dict[str, None] = {}  # ordered, and a linear-time check for repeats
    for token in (t.strip(_BLANKS) for t in raw.split(",")):
        if not token and not entries and raw.strip(_BLANKS) == "":
            break
        number = whole_number(token)
        entry = token if number is None else str(number)
        valid = (number is not None and number < MAX_WHOLE) or is_uuid(token)
        if valid and known is not None:
            valid = entry in known or (number is None and any(k.startswith(token) for k in known))
        if not valid or entry in entries:
            return CudaVisible(raw, tuple(entries), token or "(empty entry)")
        entries[entry] = None
    return CudaVisible(raw, tuple(entries))


# ----- the grant ------------------------------------------------------------------------------------
PCI_BUS_ID = "PCI_BUS_ID"
"""The `CUDA_DEVICE_ORDER` under which CUDA numbers GPUs as nvidia-smi does (PCI bus order); CUDA's
default, `FASTEST_FIRST`, puts the fastest card first."""


class Grant(NamedTuple):
    """The GPUs a process was started with: `CUDA_VISIBLE_DEVICES` as it inherited it (from a Slurm
    job, a job script, a container, the tfgpu provisioner), entry by entry in CUDA's order, which is
    how CUDA numbers them: the grant's GPU 0 is its first entry. CUDA shows the process nothing else,
    so a policy stays inside it (`GrantedCatalog`)."""

    value: str | None
    """The inherited value; None: no grant, every GPU of the machine."""
    pins: tuple[str | None, ...] = ()
    """Each entry as a policy names that GPU: its GPU or MIG UUID (whole where the inventory knows it),
    or its nvidia-smi index where CUDA numbers in PCI order (`CUDA_DEVICE_ORDER=PCI_BUS_ID` inherited
    too). None for an index in CUDA's default order (fastest first): nvidia-smi numbers in PCI order,
    so which card it is cannot be told from the index, and is not guessed."""
    cards: tuple[int | None, ...] = ()
    """The nvidia-smi index of the card each entry is on (a MIG instance: its card); None where unknown."""
    card_set: tuple[int, ...] | None = None
    """The nvidia-smi indices of the cards the grant gives where a scheduler's record says which they
    are, even where CUDA's order among them (which entry is which card) cannot be told; None: only
    `cards` tell."""
    source: SlurmGrant | None = None
    """The Slurm job whose record (`gpus.slurm`) matched this grant; None: no scheduler's record."""

    @property
    def restricts(self) -> bool:
        return self.value is not None

    @property
    def placed(self) -> bool:
        """Every entry is placed on a card of the inventory."""
        return None not in self.cards

    def granted_cards(self) -> frozenset[int] | None:
        """nvidia-smi indices of the cards this grant gives (some of them, where `placed` is False);
        None without a grant (every card). What `who` and the sidebar mark."""
        if self.value is None:
            return None
        if self.card_set is not None:
            return frozenset(self.card_set)
        return frozenset(card for card in self.cards if card is not None)

    def gives(self, card: int) -> bool:
        """Whether card `card` (nvidia-smi index) is this grant's to use: every card without a grant, or
        where its entries cannot all be placed on cards (indices in CUDA's default order: nothing is
        claimed)."""
        if self.card_set is not None:
            return card in self.card_set
        return self.value is None or not self.placed or card in self.cards

    def words(self) -> str:
        """`this kernel was granted 1 GPU (CUDA_VISIBLE_DEVICES=2)`."""
        count = len(self.pins)
        return f"this kernel was granted {count} GPU{'' if count == 1 else 's'} ({self.setting()})"

    def setting(self) -> str:
        """`CUDA_VISIBLE_DEVICES=2`, a long value cut short."""
        value = self.value or ""
        return f"CUDA_VISIBLE_DEVICES={value if len(value) <= 40 else value[:32] + '…'}"

    def pin(self, index: int) -> str:
        """The policy's name for the grant's GPU `index`, counted as CUDA counts them; `PolicyError`
        beyond the grant, or where the entry cannot be placed."""
        if index >= len(self.pins):
            raise PolicyError(f"{self.words()}: GPU {index} is outside it (its GPUs count from 0, as CUDA "
                              "numbers them)")
        pin = self.pins[index]
        if pin is None:
            raise self.unplaced(f"GPU {index}")
        return pin

    def unplaced(self, what: str) -> PolicyError:
        """The error where `what` needs to know which cards an index grant gives, and cannot."""
        return PolicyError(f"{what}: {self.words()}, by indices CUDA counts in its default order (fastest first), "
                           "not nvidia-smi's, so which card each is cannot be told; name GPUs by UUID, or start "
                           "the kernel with CUDA_DEVICE_ORDER=PCI_BUS_ID as well")

    def devices(self, inventory: Inventory) -> tuple[Gpu, ...] | None:
        """The granted devices as cards, in the grant's order: a whole card as NVML lists it, a MIG
        instance as its card under the instance's UUID and size (its free memory unknown); None where
        an entry is not placed on `inventory`. Where only the set of cards is known (`card_set`), those
        cards in nvidia-smi order. Without a grant, every card."""
        if self.value is None:
            return inventory.gpus
        if not self.placed:
            if self.card_set is None:
                return None
            return tuple(gpu for gpu in inventory.gpus if gpu.index in self.card_set)
        cards = {gpu.index: gpu for gpu in inventory.gpus}
        devices = []
        for pin, index in zip(self.pins, self.cards):
            card = cards[index]  # type: ignore[index]  (placed: each card is the inventory's)
            mig = next((mig for mig in card.mig_devices if mig.uuid == pin), None)
            devices.append(card if mig is None else
                           card._replace(uuid=mig.uuid, memory_total_mib=mig.memory_total_mib, memory_free_mib=None))
        return tuple(devices)

    def covers(self, uuid: str, card: int | None) -> bool:
        """Whether the device `uuid` (on nvidia-smi's card `card`, None if unknown) is granted: named by
        the grant, or on a card the grant gives whole (the card itself, or one of its MIG instances)."""
        if self.value is None or (card is not None and self.card_set is not None and card in self.card_set):
            return True
        return any(pin is not None and (_same_uuid(pin, uuid)
                                        or (card is not None and granted == card and not is_mig_ref(pin)))
                   for pin, granted in zip(self.pins, self.cards))


def _same_uuid(pin: str, uuid: str) -> bool:
    """Whether a grant's UUID (a prefix where the inventory did not complete it) names `uuid` (a
    prefix too, without an inventory): one starts the other, as CUDA matches a prefix."""
    pin, uuid = pin.lower(), uuid.lower()
    return whole_number(pin) is None and (uuid.startswith(pin) or pin.startswith(uuid))


def is_mig_ref(ref: str) -> bool:
    return ref.upper().startswith("MIG-")


def grant_of(value: str | None, order: str | None = None, inventory: Inventory | None = None,
             environ: Mapping[str, str] | None = None) -> Grant:
    """The grant of a process started with `CUDA_VISIBLE_DEVICES=value` and `CUDA_DEVICE_ORDER=order`,
    placed on the cards of `inventory` (NVML's; None or unavailable: UUIDs stay as given, indices are
    placed only in PCI order). Parsed as CUDA parses it (`parse_cuda_visible`).

    `environ`, the process's environment (every caller passes its own: the one way to a grant), adds
    what it tells: a Slurm job's record (`gpus.slurm`) gives the set of cards even where CUDA's order
    among them is unknown, and places a grant of one card; the CUDA driver, asked in a child
    (`gpus.cudaprobe`, only where a driver is present), places indices in CUDA's own order."""
    grant = _as_cuda_reads(value, order, inventory)
    if environ is None or value is None or inventory is None or not inventory.available:
        return grant
    entries = parse_cuda_visible(value).entries
    if not entries or len(entries) != len(grant.pins):  # CUDA stops at an entry NVML does not list
        return grant
    slurm = slurm_grant(environ)
    job = slurm.cards(inventory) if slurm is not None and slurm.matches(entries) else None
    placed = _placement(grant, value, order, inventory, environ, entries, job)
    if job is None:
        return grant if placed is None else grant._replace(pins=placed[0], cards=placed[1])
    if placed is not None and set(placed[1]) != set(_indices(job)):
        return grant  # CUDA's numbering and Slurm's record disagree: nothing tells which card is which
    pins, cards = placed if placed is not None else (grant.pins, grant.cards)
    return Grant(value, pins, cards, _indices(job), slurm)


Placement = tuple[tuple[str | None, ...], tuple[int | None, ...]]
"""(pins, cards) of a grant's entries: how a policy names each, and its nvidia-smi card."""


def _placement(grant: Grant, value: str, order: str | None, inventory: Inventory, environ: Mapping[str, str],
               entries: tuple[str, ...], job: tuple[Gpu, ...] | None) -> Placement | None:
    """Each entry's card where something tells it; None where nothing does. In PCI order an index
    counted inside a Slurm job's device cgroup (0..n-1 where Slurm's IDs are others) is the job's
    card of that rank by bus (nvidia-smi order is bus order); otherwise what `CUDA_VISIBLE_DEVICES`
    alone places; else the CUDA driver's answer (`_in_cuda_order`); else, for a job of one card, that
    card: every order numbers it 0."""
    ranks = tuple(range(len(job))) if job is not None else ()
    if job is not None and order == PCI_BUS_ID and set(entries) == {str(rank) for rank in ranks} \
            and any(gpu.minor != rank for gpu, rank in zip(job, ranks)):
        ranked = [job[int(entry)] for entry in entries]
        return tuple(gpu.uuid for gpu in ranked), tuple(gpu.index for gpu in ranked)
    if grant.placed:
        return grant.pins, grant.cards
    found = _in_cuda_order(value, order, inventory, environ, len(entries))
    if found is None and job is not None and len(job) == 1:
        return (job[0].uuid,), (job[0].index,)
    return found


def _indices(gpus: tuple[Gpu, ...]) -> tuple[int, ...]:
    return tuple(gpu.index for gpu in gpus)


def _in_cuda_order(value: str, order: str | None, inventory: Inventory, environ: Mapping[str, str],
                   count: int) -> Placement | None:
    """(UUIDs, nvidia-smi indices) of the `count` devices CUDA numbers 0, 1, … under `value`, as the
    CUDA driver answers in a child (`gpus.cudaprobe`); None where it gives no answer, another count,
    or a device NVML does not list as a card."""
    uuids = cudaprobe.cuda_uuids(value, order, environ)
    if uuids is None or len(uuids) != count:
        return None
    cards = {gpu.uuid.lower(): gpu for gpu in inventory.gpus}
    found = [cards.get(uuid.lower()) for uuid in uuids]
    if any(gpu is None for gpu in found):
        return None
    return tuple(gpu.uuid for gpu in found if gpu), tuple(gpu.index for gpu in found if gpu)


def _as_cuda_reads(value: str | None, order: str | None, inventory: Inventory | None) -> Grant:
    """`grant_of` from `CUDA_VISIBLE_DEVICES` and the inventory alone."""
    if value is None:
        return Grant(None)
    known = inventory.known_refs() if inventory is not None else None
    # With one card listed (a job whose device cgroup shows NVML only its GPU), every order numbers it 0.
    pci = order == PCI_BUS_ID or (inventory is not None and inventory.available and len(inventory.gpus) == 1)
    pins: list[str | None] = []
    cards: list[int | None] = []
    for entry in parse_cuda_visible(value, known).entries:
        if whole_number(entry) is not None:
            pins.append(entry if pci else None)
            cards.append(int(entry) if pci else None)
            continue
        found = _device(entry, inventory)
        pins.append(found[0] if found else entry)
        cards.append(found[1] if found else None)
    return Grant(value, tuple(pins), tuple(cards))


def _device(prefix: str, inventory: Inventory | None) -> tuple[str, int] | None:
    """(whole UUID, nvidia-smi index of its card) of the one GPU or MIG instance whose UUID starts with
    `prefix`; None where the inventory does not tell."""
    if inventory is None or not inventory.available:
        return None
    found = [(device.uuid, gpu.index) for gpu in inventory.gpus for device in (gpu, *gpu.mig_devices)
             if device.uuid.lower().startswith(prefix.lower())]
    return found[0] if len(found) == 1 else None


class GrantedCatalog:
    """A `language.grammar.GpuCatalog` that keeps a policy inside the grant (`grant()`, read each time:
    the inventory changes): an index counts within it, as CUDA numbers the GPUs (`visible 0` is the
    grant's first GPU, named as `Grant.pins` says, so the plan's `CUDA_VISIBLE_DEVICES` and
    `%tfgpu export` name that very GPU); a GPU outside it is refused; `visible auto` and `limit NN%`
    see only its GPUs. Without a grant it is `catalog` itself."""

    def __init__(self, catalog: InventoryCatalog, grant: Callable[[], Grant]) -> None:
        self.catalog = catalog
        self.grant = grant

    @property
    def inventory(self) -> Inventory:
        return self.catalog.inventory

    def resolve(self, ref: str) -> str:
        grant = self.grant()
        if not grant.restricts:
            return self.catalog.resolve(ref)
        if whole_number(ref) is not None:
            return self.catalog.resolve(grant.pin(int(ref)))
        resolved = self.catalog.resolve(ref)
        if not grant.covers(resolved, self.inventory.card_index(resolved)):
            raise PolicyError(f"{short_uuid(resolved)}: {grant.words()}, and this GPU is not among them")
        return resolved

    def total_mib(self, ref: str) -> int | None:
        return self.catalog.total_mib(ref)

    def refs(self) -> list[str]:
        grant = self.grant()
        if not grant.restricts:
            return self.catalog.refs()
        return [self.catalog.resolve(grant.pin(index)) for index in range(len(grant.pins))]

    def is_mig(self, ref: str) -> bool:
        return self.catalog.is_mig(ref)

    def by_free_memory(self) -> list[Gpu]:
        """The granted GPUs, freest first (`Grant.devices`: a MIG instance as its card)."""
        ranked = self.catalog.by_free_memory()  # refuses a missing or stale inventory
        grant = self.grant()
        if not grant.restricts:
            return ranked
        devices = grant.devices(self.inventory)
        if devices is None:
            raise grant.unplaced("visible auto")
        return sorted(devices, key=freest_first)

    def scope(self) -> str:
        grant = self.grant()
        return grant.words() if grant.restricts else self.catalog.scope()

    def uuid_to_index(self) -> dict[str, str]:
        return self.catalog.uuid_to_index()
