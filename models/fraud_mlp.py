"""Tabular fraud model: numeric embeddings + categorical embeddings -> residual MLP -> logits of
``ensemble_size`` members -> their mean.

Numeric features: signed log + standardisation (training-set statistics) and, with
``numeric_bins > 0``, a piecewise-linear encoding plus a step at each edge, on tree-fitted bin edges
(:mod:`models.piecewise_linear`) followed by a per-feature linear layer and ReLU (Gorishniy et al.
2022). Members (TabM-mini, Gorishniy et al. 2024): one shared backbone, a per-member multiplicative
adapter on its input and a per-member output unit; each member is trained on its own loss
(``forward(..., per_member=True)``) and the model scores with the mean of the members' logits.

Everything needed to score lives inside the module as tensors: normalisation statistics, bin edges,
the calibration temperature (buffers) and the weights; a blended model also carries a LightGBM
booster (:mod:`models.gbm`, saved beside the weights as text) whose weighted raw score is added to
the calibrated logit. Saving writes ``model.safetensors`` (tensors
only) and ``model.json`` (the architecture config); loading never unpickles objects. A config
without ``numeric_bins`` / ``ensemble_size`` / ``sequence_hidden`` (a model saved before they existed)
loads as the plain standardised-input, single-output model it was.

Sequence branch (``sequence_hidden > 0``): the card's last payments (``sequence_columns``, step-major,
step 1 the most recent) are also read as a sequence. Their standardised values go, oldest to newest,
through a GRU whose last hidden state joins the MLP's input. What matters there is order and gaps:
whether the payments before this one shared its merchant and country, and how close together they
came, a pattern a per-column embedding sees only one cell at a time. The columns stay in the numeric
path as well; the GRU reads them in addition.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from models.gbm import GbmTerm, load_gbm_term, remove_gbm_term, save_gbm_term
from models.piecewise_linear import PiecewiseLinearEncoding

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "model.json"


@dataclass(frozen=True)
class FraudModelConfig:
    numeric_features: tuple[str, ...]
    categorical_features: dict[str, int]  # column -> cardinality (code 0 = unknown)
    embedding_dim: int = 8
    hidden_dim: int = 128
    num_blocks: int = 2  # residual blocks after the input projection
    dropout: float = 0.1
    # The defaults below rebuild models saved before these fields existed; training sets them from
    # [model] of train.toml (pipeline.training.config.ModelConfig).
    numeric_bins: int = 0  # PLE bins per numeric feature; 0 = standardised values only
    numeric_embedding_dim: int = 8  # width of each numeric feature's embedding (with numeric_bins > 0)
    ensemble_size: int = 1  # TabM-mini members sharing the backbone
    # The card's last payments, step-major (steps x fields, step 1 the most recent), all among
    # numeric_features; read by a GRU of width sequence_hidden (0 = no sequence branch).
    sequence_columns: tuple[str, ...] = ()
    sequence_steps: int = 0
    sequence_hidden: int = 0

    def to_json(self) -> str:
        # No sort_keys: the order of categorical_features is the order of the embedding tables.
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str) -> FraudModelConfig:
        d = json.loads(text)
        d["numeric_features"] = tuple(d["numeric_features"])
        d["sequence_columns"] = tuple(d.get("sequence_columns", ()))
        return FraudModelConfig(**d)


def squash(numeric: torch.Tensor) -> torch.Tensor:
    """Signed log, ``sign(x) * log1p(|x|)``, applied before standardisation.

    Amounts, counts and seconds-since-previous span orders of magnitude; standardised raw values
    would put most rows in a sliver near the mean and a few far out. Monotone, so nothing a tree
    model could split on is lost. The training-set mean/std are taken of the squashed values.
    """
    return torch.sign(numeric) * torch.log1p(numeric.abs())


class ResidualBlock(nn.Module):
    """Pre-norm MLP block: x + W2·drop(GELU(W1·LN(x)))."""

    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.drop(nn.functional.gelu(self.fc1(self.norm(x)))))


class NumericEmbedding(nn.Module):
    """``PLE(x) ++ steps(x) ++ z`` of each feature -> its own ``Linear -> ReLU``:
    ``[B, F]`` x2 -> ``[B, F * dim]``.

    ``x`` are the raw values (non-finite ones encode as all-zero bins), ``z`` the standardised
    squashed values, kept beside the bins for magnitudes beyond the outermost edges.
    """

    def __init__(self, num_features: int, bins: int, dim: int) -> None:
        super().__init__()
        self.encoding = PiecewiseLinearEncoding(num_features, bins)
        inputs = 2 * bins + 1  # per feature: bin fills, bin steps, z
        bound = 1.0 / math.sqrt(inputs)  # nn.Linear's default initialisation, per feature
        self.weight = nn.Parameter(torch.empty(num_features, inputs, dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num_features, dim).uniform_(-bound, bound))

    def forward(self, raw: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        finite = torch.isfinite(raw)
        bins = self.encoding(torch.where(finite, raw, torch.zeros_like(raw))) * finite.unsqueeze(-1)
        per_feature = torch.einsum("bfi,fid->bfd", torch.cat([bins, z.unsqueeze(-1)], dim=-1), self.weight)
        return torch.relu(per_feature + self.bias).flatten(1)


class MemberHeads(nn.Module):
    """``[B, k, H] -> [B, k]``: one output unit per ensemble member (``k = 1``: an ``nn.Linear(H, 1)``,
    with the same parameter names and shapes)."""

    def __init__(self, members: int, dim: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(dim)
        self.weight = nn.Parameter(torch.empty(members, dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members).uniform_(-bound, bound))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h * self.weight).sum(-1) + self.bias


def sequence_column_index(config: FraudModelConfig) -> list[int]:
    """Positions of ``config.sequence_columns`` in ``numeric_features``, step-major; raises
    ``ValueError`` naming what is wrong when a sequence branch (``sequence_hidden > 0``) cannot be built."""
    columns, steps = config.sequence_columns, config.sequence_steps
    if config.sequence_hidden < 0:
        raise ValueError(f"sequence_hidden must be >= 0 (0 = no sequence branch), got {config.sequence_hidden}")
    if not columns:
        raise ValueError("sequence_hidden > 0 needs sequence_columns (the card's last payments, step-major)")
    if steps < 1 or len(columns) % steps:
        raise ValueError(f"{len(columns)} sequence_columns do not split into sequence_steps = {steps} steps")
    missing = [c for c in columns if c not in config.numeric_features]
    if missing:
        raise ValueError(f"sequence_columns not among numeric_features: {missing}")
    return [config.numeric_features.index(c) for c in columns]


class SequenceEncoder(nn.Module):
    """``z[B, F] -> [B, hidden]``: the sequence columns of the standardised values as
    ``[B, steps, fields]``, run oldest -> newest through a GRU; its last hidden state."""

    def __init__(self, index: list[int], steps: int, hidden: int) -> None:
        super().__init__()
        self.steps, self.fields = steps, len(index) // steps
        # Derived from the config, so not saved with the weights (persistent=False).
        self.register_buffer("index", torch.tensor(index, dtype=torch.int64), persistent=False)
        self.gru = nn.GRU(self.fields, hidden, batch_first=True)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        # Step 1 is the most recent payment: flip so the GRU ends on it.
        steps = z.index_select(1, self.index).unflatten(1, (self.steps, self.fields)).flip(1)
        _, last = self.gru(steps)  # [1, B, hidden]
        return last[0]


class FraudModel(nn.Module):
    """``forward(numeric[B, F] float32, categorical[B, C] int64) -> logit[B]`` (the members' mean);
    ``per_member=True`` gives the members' logits ``[B, ensemble_size]`` (training)."""

    def __init__(self, config: FraudModelConfig) -> None:
        super().__init__()
        self.config = config
        n_num = len(config.numeric_features)
        # Normalisation statistics: set from the training rows by set_normalization(); stored as buffers
        # so they travel with the weights and the scorer applies exactly what training applied.
        self.register_buffer("num_mean", torch.zeros(n_num))
        self.register_buffer("num_std", torch.ones(n_num))
        # Temperature scaling, fitted on validation data after training (1.0 = uncalibrated).
        self.register_buffer("temperature", torch.ones(()))
        self.numeric_embedding = (NumericEmbedding(n_num, config.numeric_bins, config.numeric_embedding_dim)
                                  if config.numeric_bins > 0 else None)
        self.embeddings = nn.ModuleList(
            nn.Embedding(card, config.embedding_dim) for card in config.categorical_features.values()
        )
        self.sequence = (SequenceEncoder(sequence_column_index(config), config.sequence_steps,
                                         config.sequence_hidden) if config.sequence_hidden != 0 else None)
        numeric_dim = n_num * (config.numeric_embedding_dim if config.numeric_bins > 0 else 1)
        in_dim = numeric_dim + config.embedding_dim * len(config.categorical_features) + config.sequence_hidden
        self.input = nn.Linear(in_dim, config.hidden_dim)
        if config.ensemble_size > 1:
            # TabM-mini's adapter: random signs make the members differ from the first step on.
            signs = torch.randint(0, 2, (config.ensemble_size, config.hidden_dim)) * 2.0 - 1.0
            self.member_scale = nn.Parameter(signs)
        self.blocks = nn.Sequential(*(ResidualBlock(config.hidden_dim, config.dropout) for _ in range(config.num_blocks)))
        self.head = nn.Sequential(nn.LayerNorm(config.hidden_dim), MemberHeads(config.ensemble_size, config.hidden_dim))
        # A blended model's boosted term (models.gbm), added to the calibrated logit; None: network only.
        self.gbm: GbmTerm | None = None

    def set_normalization(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.num_mean.copy_(mean)
        # A constant column would divide by ~0; treat it as unit scale instead.
        self.num_std.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def set_bin_edges(self, edges: torch.Tensor) -> None:
        """``[F, numeric_bins + 1]`` sorted edges per numeric feature (see models.piecewise_linear)."""
        if self.numeric_embedding is None:
            raise ValueError("this model has numeric_bins = 0: it has no bin edges to set")
        self.numeric_embedding.encoding.set_edges(edges)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor, per_member: bool = False) -> torch.Tensor:
        z = (squash(numeric) - self.num_mean) / self.num_std
        # Non-finite inputs (missing history) become 0 = the training mean, never NaN logits.
        z = torch.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0).clamp(-20.0, 20.0)
        parts = [z if self.numeric_embedding is None else self.numeric_embedding(numeric, z)]
        for i, emb in enumerate(self.embeddings):
            codes = categorical[:, i].clamp(0, emb.num_embeddings - 1)
            parts.append(emb(codes))
        if self.sequence is not None:
            parts.append(self.sequence(z))
        h = self.input(torch.cat(parts, dim=1)).unsqueeze(1)  # [B, 1, H]
        if self.config.ensemble_size > 1:
            h = h * self.member_scale  # [B, k, H]
        logits = self.head(self.blocks(h))  # [B, k]
        return logits if per_member else logits.mean(-1)

    def calibrated_logit(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        """The network's calibrated log-odds (the boosted term of a blend not included): what the
        scorer traces into a graph."""
        return self.forward(numeric, categorical) / self.temperature

    def gbm_logit(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor | None:
        """The boosted term of a blend per row (float32, CPU), None for a network-only model."""
        if self.gbm is None:
            return None
        return torch.from_numpy(self.gbm.logit(numeric.cpu().numpy(), categorical.cpu().numpy())).float()

    @torch.no_grad()
    def predict_proba(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        """Calibrated fraud probability per row, the boosted term included (eval mode is the caller's job)."""
        logit = self.calibrated_logit(numeric, categorical)
        boosted = self.gbm_logit(numeric, categorical)
        return torch.sigmoid(logit if boosted is None else logit + boosted.to(logit.device))


def frame_to_tensors(frame, config: FraudModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw feature columns of a pandas DataFrame -> (numeric, categorical) tensors for ``forward``.

    Missing numeric values become NaN (handled in ``forward``); missing codes become 0 (unknown).
    Raises ``KeyError`` naming the absent columns, so a schema mismatch is a clear error.
    """
    wanted = list(config.numeric_features) + list(config.categorical_features)
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        raise KeyError(f"input is missing feature columns: {missing}")
    numeric = frame[list(config.numeric_features)].to_numpy(dtype=np.float32, na_value=np.nan)
    cats = list(config.categorical_features)
    categorical = (
        frame[cats].fillna(0).to_numpy(dtype=np.int64) if cats else np.zeros((len(frame), 0), dtype=np.int64)
    )
    # np.array copies: pandas may hand back read-only views, which torch refuses to wrap safely.
    return torch.from_numpy(np.array(numeric, order="C")), torch.from_numpy(np.array(categorical, order="C"))


def save_model(model: FraudModel, directory: Path) -> None:
    """Write weights (safetensors), config (JSON) and a blend's booster into ``directory``.

    Not atomic and not flushed: a directory that anyone may read while it is saved (a run's
    ``model/``, an export) is built beside its name and published whole, ``with
    pipeline.atomic.staged_dir(d) as tmp: save_model(model, tmp)``, so a reader or a kill finds the
    previous model or this one, never weights paired with another save's booster. (This package
    ships alone with each MLflow version, so it does not import the pipeline's helper itself.)
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(model.config.to_json())
    if model.gbm is not None:
        save_gbm_term(model.gbm, directory)
    else:  # a network-only model saved over a blend must not load back as one
        remove_gbm_term(directory)


def load_model(directory: Path) -> FraudModel:
    """Rebuild a model saved by :func:`save_model`, in eval mode, on CPU."""
    directory = Path(directory)
    config = FraudModelConfig.from_json((directory / CONFIG_FILE).read_text())
    model = FraudModel(config)
    model.load_state_dict(load_file(str(directory / WEIGHTS_FILE)))
    model.gbm = load_gbm_term(directory)
    return model.eval()
