"""`CUDA_VISIBLE_DEVICES` read the way CUDA reads it, and the grant it makes: the GPUs a process
was started with, placed on NVML's cards, and the catalog that keeps a policy inside them (pure:
the inventory is given)."""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..errors import PolicyError
from ..language.policy import MAX_WHOLE, is_uuid, short_uuid, whole_number
from .inventory import Gpu, Inventory, InventoryCatalog, freest_first

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
        return None if self.value is None else frozenset(card for card in self.cards if card is not None)

    def gives(self, card: int) -> bool:
        """Whether card `card` (nvidia-smi index) is this grant's to use: every card without a grant, or
        where its entries cannot all be placed on cards (indices in CUDA's default order: nothing is
        claimed)."""
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
        an entry is not placed on `inventory`. Without a grant, every card."""
        if self.value is None:
            return inventory.gpus
        if not self.placed:
            return None
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
        if self.value is None:
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


def grant_of(value: str | None, order: str | None = None, inventory: Inventory | None = None) -> Grant:
    """The grant of a process started with `CUDA_VISIBLE_DEVICES=value` and `CUDA_DEVICE_ORDER=order`,
    placed on the cards of `inventory` (NVML's; None or unavailable: UUIDs stay as given, indices are
    placed only in PCI order). Parsed as CUDA parses it (`parse_cuda_visible`)."""
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
