"""The card and merchant population: who pays, where, how much and when. Fixed by the seed alone,
so every window simulated with one seed sees the same cards and merchants.

Amounts are in the transaction currency: euro countries pay in EUR, GB in GBP, CH in CHF and every
other country in USD (cross-border acquirers settle in dollars); the rates are close to 1, so
amount features stay comparable across currencies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.simulation.config import PopulationConfig

HOME_COUNTRIES = ("DE", "FR", "GB", "ES", "IT", "NL", "BE", "AT", "IE", "PT")
HOME_WEIGHTS = (0.25, 0.20, 0.15, 0.10, 0.10, 0.08, 0.04, 0.03, 0.03, 0.02)
NEAR_COUNTRIES = HOME_COUNTRIES + ("CH",)  # where European cardholders travel most
FAR_COUNTRIES = ("US", "BR", "TH", "ID", "MX", "TR", "AE", "ZA", "VN", "PH")
COUNTRIES = NEAR_COUNTRIES + FAR_COUNTRIES
FAR_COUNTRY_IDX = np.arange(len(NEAR_COUNTRIES), len(COUNTRIES))
US_IDX = COUNTRIES.index("US")
_CURRENCY = {"GB": "GBP", "CH": "CHF", **{c: "USD" for c in FAR_COUNTRIES}}
CURRENCIES = ("EUR", "GBP", "CHF", "USD")
EUR_TO_CURRENCY = np.array([1.0, 0.86, 0.94, 1.08])
COUNTRY_CURRENCY = np.array([CURRENCIES.index(_CURRENCY.get(c, "EUR")) for c in COUNTRIES])

# Merchant kinds: where a card is physically present, cash machines, and card-not-present shops.
PHYSICAL, ATM, ONLINE = 0, 1, 2
NUM_KINDS = 3


@dataclass(frozen=True)
class MccProfile:
    code: str
    kind: int
    share: float  # share of merchants with this code
    amount_factor: float  # typical ticket relative to the card's median payment


MCCS = (
    MccProfile("5411", PHYSICAL, 0.22, 1.0),  # grocery
    MccProfile("5812", PHYSICAL, 0.14, 1.3),  # restaurants
    MccProfile("5814", PHYSICAL, 0.10, 0.35),  # fast food
    MccProfile("5541", PHYSICAL, 0.08, 1.6),  # fuel
    MccProfile("5311", PHYSICAL, 0.05, 2.0),  # department stores
    MccProfile("5912", PHYSICAL, 0.05, 0.8),  # pharmacies
    MccProfile("7011", PHYSICAL, 0.03, 5.0),  # hotels
    MccProfile("4121", PHYSICAL, 0.03, 0.9),  # taxis
    MccProfile("6011", ATM, 0.06, 3.0),  # cash withdrawal
    MccProfile("5999", ONLINE, 0.09, 1.5),  # miscellaneous online retail
    MccProfile("5815", ONLINE, 0.05, 0.3),  # digital goods (card testers' favourite)
    MccProfile("5732", ONLINE, 0.04, 4.0),  # electronics
    MccProfile("4511", ONLINE, 0.03, 8.0),  # airlines
    MccProfile("5964", ONLINE, 0.03, 1.5),  # mail/telephone order (channel moto)
)
MCC_CODES = tuple(m.code for m in MCCS)
MCC_KIND = np.array([m.kind for m in MCCS])
MCC_LOG_FACTOR = np.log([m.amount_factor for m in MCCS])
MOTO_MCC = MCC_CODES.index("5964")
DIGITAL_MCC = MCC_CODES.index("5815")
# Card testers try tiny digital purchases; cashers-out buy resellable goods.
TESTING_MCCS = np.array([DIGITAL_MCC, MCC_CODES.index("5999")])
RESELLABLE_MCCS = np.array([MCC_CODES.index("5732"), MCC_CODES.index("5999"), MCC_CODES.index("4511")])
# Where cardholders make their genuine one-off big purchases (and takers of accounts shop too).
BIG_TICKET_MCCS = np.array([MCC_CODES.index(code) for code in ("5732", "4511", "7011", "5311")])
# Every run has these, whatever the random draw: the fraud patterns need a shop and a cash machine
# in every country and US web shops of the kinds fraudsters use.
_GUARANTEED = (
    [(c, MCC_CODES.index("5411")) for c in range(len(COUNTRIES))]
    + [(c, MCC_CODES.index("6011")) for c in range(len(COUNTRIES))]
    + [(US_IDX, MCC_CODES.index(code)) for code in ("5815", "5999", "5732")]
)


@dataclass(frozen=True)
class Cards:
    """Per-card spending profile; index ``i`` is card ``names[i]``."""

    names: pa.Array
    home: np.ndarray  # country index
    amount_mu: np.ndarray  # log of the card's median payment in EUR
    amount_sigma: np.ndarray  # lognormal spread of its payments
    daily_rate: np.ndarray  # expected payments per day
    peak_hour: np.ndarray  # UTC hour around which it pays (night owls: around midnight)
    hour_spread: np.ndarray  # std of its payment hour
    online_share: np.ndarray  # probability a payment is card-not-present
    travel_share: np.ndarray  # probability a given day is spent abroad

    @property
    def count(self) -> int:
        return len(self.home)

    def mean_amount(self) -> np.ndarray:
        return np.exp(self.amount_mu + self.amount_sigma**2 / 2)

    def home_devices(self, card: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Device codes of the cards' own devices: two per card (phone and laptop)."""
        return card.astype(np.int64) * 2 + (rng.random(len(card)) < 0.3)

    def fraud_devices(self, rng: np.random.Generator, n: int, pool: int = 64) -> np.ndarray:
        """Device codes fraudsters use: a small shared pool, never a cardholder's own device."""
        return 2 * self.count + rng.integers(0, pool, n)


@dataclass(frozen=True)
class Merchants:
    names: pa.Array
    country: np.ndarray  # country index
    mcc: np.ndarray  # index into MCCS
    kind: np.ndarray  # PHYSICAL / ATM / ONLINE

    @property
    def count(self) -> int:
        return len(self.country)


def build_cards(rng: np.random.Generator, n: int, mean_daily_rate: float, config: PopulationConfig) -> Cards:
    night_owl = rng.random(n) < config.night_owl_share
    online, travel = config.online_share, config.travel_day_share
    return Cards(
        names=id_strings("card-", np.arange(n), 8),
        home=rng.choice(len(HOME_COUNTRIES), size=n, p=HOME_WEIGHTS),
        amount_mu=rng.normal(np.log(config.median_amount_eur), 0.5, n),
        amount_sigma=rng.uniform(0.5, 1.0, n),
        daily_rate=rng.gamma(2.0, mean_daily_rate / 2.0, n),
        peak_hour=np.where(night_owl, np.mod(rng.uniform(21.0, 27.0, n), 24.0), rng.uniform(8.0, 19.0, n)),
        hour_spread=rng.uniform(1.5, 4.0, n),
        online_share=rng.beta(2.0, 2.0 * (1.0 - online) / online, n),  # mean = config.online_share
        travel_share=rng.beta(1.0, (1.0 - travel) / travel, n),
    )


def build_merchants(rng: np.random.Generator, n: int) -> Merchants:
    fixed_country, fixed_mcc = (np.array(x) for x in zip(*_GUARANTEED, strict=True))
    k = n - len(fixed_country)
    shares = np.array([m.share for m in MCCS])
    mcc = rng.choice(len(MCCS), size=k, p=shares / shares.sum())
    kind = MCC_KIND[mcc]
    home = rng.choice(len(HOME_COUNTRIES), size=k, p=HOME_WEIGHTS)
    far = rng.choice(FAR_COUNTRY_IDX, size=k)
    u = rng.random(k)
    # Shops and cash machines are mostly in the cardholders' countries; web shops often in the US.
    country = np.where(u < 0.88, home, np.where(u < 0.90, NEAR_COUNTRIES.index("CH"), far))
    country = np.where((kind == ONLINE) & (u > 0.65), US_IDX, np.where(kind == ONLINE, home, country))
    mcc = np.concatenate([fixed_mcc, mcc])
    return Merchants(names=id_strings("mer-", np.arange(n), 6),
                     country=np.concatenate([fixed_country, country]), mcc=mcc, kind=MCC_KIND[mcc])


class MerchantGroups:
    """Merchants indexed by (country, kind) for vectorised uniform picks within a group."""

    def __init__(self, merchants: Merchants) -> None:
        key = merchants.country * NUM_KINDS + merchants.kind
        self._order = np.argsort(key, kind="stable")
        self._counts = np.bincount(key, minlength=len(COUNTRIES) * NUM_KINDS)
        self._starts = np.cumsum(self._counts) - self._counts
        self._merchants = merchants

    def pick(self, rng: np.random.Generator, country: np.ndarray, kind: np.ndarray | int) -> np.ndarray:
        """One uniformly chosen merchant of ``kind`` in ``country`` per element."""
        key = np.asarray(country) * NUM_KINDS + kind
        counts = self._counts[key]
        if np.any(counts == 0):  # the guaranteed merchants make this unreachable for shops and ATMs
            raise ValueError("no merchant of the requested kind in some country")
        offset = (rng.random(len(key)) * counts).astype(np.int64)
        return self._order[self._starts[key] + offset]

    def pick_where(self, rng: np.random.Generator, mask: np.ndarray, n: int) -> np.ndarray:
        """``n`` merchants chosen uniformly among those where ``mask`` holds."""
        candidates = np.flatnonzero(mask)
        return candidates[rng.integers(0, len(candidates), n)]


def id_strings(prefix: str, numbers: np.ndarray, width: int) -> pa.Array:
    """``prefix`` + zero-padded ``numbers`` as an Arrow string array (fast for millions of ids)."""
    digits = pc.utf8_lpad(pc.cast(pa.array(numbers, pa.int64()), pa.string()), width, "0")
    return pc.binary_join_element_wise(prefix, digits, "")


REGULARS_PER_CARD = 4  # the corner shop, the usual café...


@dataclass(frozen=True)
class Population:
    """Cards, merchants and each card's regular shops (in its home country)."""

    cards: Cards
    merchants: Merchants
    groups: MerchantGroups
    regulars: np.ndarray  # (cards, REGULARS_PER_CARD) merchant indexes


def build_population(seed: int, num_cards: int, num_merchants: int, mean_daily_rate: float,
                     config: PopulationConfig) -> Population:
    """The population of ``seed``: independent of the window, so consecutive nights share cards."""
    rng = np.random.default_rng([seed, _POPULATION_STREAM])
    cards = build_cards(rng, num_cards, mean_daily_rate, config)
    merchants = build_merchants(rng, num_merchants)
    groups = MerchantGroups(merchants)
    regulars = groups.pick(rng, np.repeat(cards.home, REGULARS_PER_CARD), PHYSICAL)
    return Population(cards, merchants, groups, regulars.reshape(num_cards, REGULARS_PER_CARD))


_POPULATION_STREAM = 0x5EED  # distinct from any window's stream (those use the date ordinal)
