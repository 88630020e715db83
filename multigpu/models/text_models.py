"""Text models: a BERT encoder and a GPT-style decoder, built from the transformer layer specs.

Both take int64 token ids (``input_ids``) and, optionally, Hugging Face's attention mask
(``attention_mask``: 1 for a token, 0 for padding) as a second named input, each of
per-example shape (seq_len,); ``seq_len`` is the length the model is measured at
(``layer_stats``), and a run may feed any length up to ``max_positions``.

* :func:`bert` names its nodes after ``transformers``' ``BertModel`` modules, so
  ``Model.param_keys()`` are its tensor names (``encoder.layer.0.attention.self.query.weight``)
  and a checkpoint loads by name (``multigpu.models.checkpoints``). Its blocks are
  post-norm: ``LayerNorm(x + Dropout(f(x)))``. The output is the last hidden state (S, D).
* :func:`gpt` is decoder-only and causal with pre-norm blocks, as GPT-2:
  ``x + Dropout(f(LayerNorm(x)))``, a final LayerNorm and an **untied** head (``lm_head``, a
  Dense with bias to the vocabulary): a model's parameters belong to one node each, so the
  head does not share the token table. The output is the logits (S, vocab).

Dropout nodes are in the graph in both; they act only in training runs (``RunContext``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from multigpu.errors import ModelError
from multigpu.models.attention import AttentionMask, MultiHeadAttention, check_heads
from multigpu.models.dropout import Dropout
from multigpu.models.graph import Model
from multigpu.models.layers import Add, Dense
from multigpu.models.node import Input, Node
from multigpu.models.transformer_layers import GELU, Embedding, LayerNorm, PositionEmbedding, TokenTypeEmbedding

IDS, MASK, TYPES = "input_ids", "attention_mask", "token_type_ids"


@dataclass(frozen=True)
class BlockConfig:
    """What a transformer block needs: sizes, LayerNorm eps, dropout rates and the GELU form."""

    hidden: int
    heads: int
    ffn: int
    eps: float
    dropout: float
    attention_dropout: float
    gelu_approximate: bool


def encoder_block(prefix: str, source: str, mask: str | None, cfg: BlockConfig) -> list[Node]:
    """A post-norm encoder block (BERT's ``BertLayer``) consuming ``source`` and the padding
    ``mask`` node (None: no padding); node names follow ``transformers``' modules under ``prefix``."""
    att, out = f"{prefix}.attention", f"{prefix}.output"
    return [
        Node(
            att,
            MultiHeadAttention(cfg.heads, causal=False, dropout=cfg.attention_dropout),
            (source, mask) if mask else (source,),
        ),
        Node(f"{att}.output.dropout", Dropout(cfg.dropout), (att,)),
        Node(f"{att}.output.add", Add(), (f"{att}.output.dropout", source)),
        Node(f"{att}.output.LayerNorm", LayerNorm(cfg.eps), (f"{att}.output.add",)),
        Node(f"{prefix}.intermediate.dense", Dense(cfg.ffn), (f"{att}.output.LayerNorm",)),
        Node(f"{prefix}.intermediate.gelu", GELU(cfg.gelu_approximate), (f"{prefix}.intermediate.dense",)),
        Node(f"{out}.dense", Dense(cfg.hidden), (f"{prefix}.intermediate.gelu",)),
        Node(f"{out}.dropout", Dropout(cfg.dropout), (f"{out}.dense",)),
        Node(f"{out}.add", Add(), (f"{out}.dropout", f"{att}.output.LayerNorm")),
        Node(f"{out}.LayerNorm", LayerNorm(cfg.eps), (f"{out}.add",)),
    ]


def decoder_block(prefix: str, source: str, mask: str | None, cfg: BlockConfig) -> list[Node]:
    """A pre-norm causal decoder block (GPT-2's) consuming ``source`` and the padding ``mask``
    node (None: no padding): ``x + attn(ln_1(x))``, then ``+ mlp(ln_2(.))``."""
    return [
        Node(f"{prefix}.ln_1", LayerNorm(cfg.eps), (source,)),
        Node(
            f"{prefix}.attn",
            MultiHeadAttention(cfg.heads, causal=True, dropout=cfg.attention_dropout),
            (f"{prefix}.ln_1", mask) if mask else (f"{prefix}.ln_1",),
        ),
        Node(f"{prefix}.attn_dropout", Dropout(cfg.dropout), (f"{prefix}.attn",)),
        Node(f"{prefix}.add_1", Add(), (f"{prefix}.attn_dropout", source)),
        Node(f"{prefix}.ln_2", LayerNorm(cfg.eps), (f"{prefix}.add_1",)),
        Node(f"{prefix}.mlp.c_fc", Dense(cfg.ffn), (f"{prefix}.ln_2",)),
        Node(f"{prefix}.mlp.gelu", GELU(cfg.gelu_approximate), (f"{prefix}.mlp.c_fc",)),
        Node(f"{prefix}.mlp.c_proj", Dense(cfg.hidden), (f"{prefix}.mlp.gelu",)),
        Node(f"{prefix}.mlp.dropout", Dropout(cfg.dropout), (f"{prefix}.mlp.c_proj",)),
        Node(f"{prefix}.add_2", Add(), (f"{prefix}.mlp.dropout", f"{prefix}.add_1")),
    ]


def _check_sizes(what: str, **sizes: int) -> None:
    for k, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelError(f"{what}: {k}={v!r} must be an integer >= 1")


def _inputs(seq_len: int, max_positions: int, mask: bool, what: str, types: bool = False) -> list[Input]:
    if seq_len > max_positions:
        raise ModelError(
            f"{what}: seq_len={seq_len} is longer than the position table (max_positions={max_positions}); "
            f"use seq_len <= {max_positions} or a larger max_positions"
        )
    names = [IDS] + [MASK] * mask + [TYPES] * types
    return [Input(n, (seq_len,), "int64") for n in names]


def bert(
    vocab_size: int = 30522,
    hidden: int = 768,
    layers: int = 12,
    heads: int = 12,
    ffn: int = 3072,
    max_positions: int = 512,
    type_vocab: int = 2,
    eps: float = 1e-12,
    gelu_approximate: bool = False,
    dropout: float = 0.1,
    attention_dropout: float = 0.1,
    seq_len: int = 128,
    mask: bool = True,
    token_types: bool = False,
    name: str = "bert",
) -> Model:
    """A BERT encoder (``transformers``' ``BertModel`` without its pooler); returns a Model whose
    output is the last hidden state (seq_len, hidden).

    The defaults are BERT-base's. ``mask`` adds the ``attention_mask`` input and
    ``token_types`` the ``token_type_ids`` input (segments; without it every token is of
    type 0, as a single sentence is); ``seq_len`` is the measured length. Parameters start
    as BERT's: N(0, 0.02) weights and tables, zero biases, LayerNorm 1 and 0. Raises
    ModelError for a size < 1, heads that do not divide ``hidden`` or ``seq_len > max_positions``.
    """
    what = f"bert {name!r}"
    _check_sizes(
        what, vocab_size=vocab_size, hidden=hidden, layers=layers, ffn=ffn, max_positions=max_positions,
        type_vocab=type_vocab, seq_len=seq_len,
    )  # fmt: skip
    check_heads(heads, hidden, what)
    cfg = BlockConfig(hidden, heads, ffn, eps, dropout, attention_dropout, gelu_approximate)
    emb = "embeddings"
    nodes = [
        Node(f"{emb}.word_embeddings", Embedding(vocab_size, hidden), (IDS,)),
        Node(f"{emb}.position_embeddings", PositionEmbedding(max_positions), (f"{emb}.word_embeddings",)),
        Node(
            f"{emb}.token_type_embeddings",
            TokenTypeEmbedding(type_vocab),
            (f"{emb}.position_embeddings", TYPES) if token_types else (f"{emb}.position_embeddings",),
        ),
        Node(f"{emb}.LayerNorm", LayerNorm(eps), (f"{emb}.token_type_embeddings",)),
        Node(f"{emb}.dropout", Dropout(dropout), (f"{emb}.LayerNorm",)),
    ]
    pad = None
    if mask:
        pad = "extended_attention_mask"
        nodes.append(Node(pad, AttentionMask(), (IDS, MASK)))
    source = f"{emb}.dropout"
    for i in range(layers):
        nodes += encoder_block(f"encoder.layer.{i}", source, pad, cfg)
        source = nodes[-1].name
    inputs = _inputs(seq_len, max_positions, mask, what, token_types)
    return Model.from_nodes(nodes, name=name, init="textbook", inputs=inputs, init_scale=0.02)


def gpt(
    vocab_size: int = 50257,
    hidden: int = 768,
    layers: int = 12,
    heads: int = 12,
    ffn: int | None = None,
    max_positions: int = 1024,
    eps: float = 1e-5,
    gelu_approximate: bool = True,
    dropout: float = 0.1,
    attention_dropout: float = 0.1,
    seq_len: int = 128,
    mask: bool = False,
    name: str = "gpt",
) -> Model:
    """A GPT-style decoder-only causal language model; returns a Model whose output is the
    logits (seq_len, vocab_size) for the next token at each position.

    The defaults are GPT-2 small's (``ffn`` 4 * hidden unless given, tanh GELU, eps 1e-5),
    with an untied head (``lm_head``). ``mask`` adds an ``attention_mask`` input for padded
    batches. Raises ModelError as :func:`bert` does.
    """
    what = f"gpt {name!r}"
    ffn = 4 * hidden if ffn is None and isinstance(hidden, int) else ffn
    _check_sizes(
        what, vocab_size=vocab_size, hidden=hidden, layers=layers, ffn=ffn, max_positions=max_positions,
        seq_len=seq_len,
    )  # fmt: skip
    check_heads(heads, hidden, what)
    cfg = BlockConfig(hidden, heads, ffn, eps, dropout, attention_dropout, gelu_approximate)
    nodes = [
        Node("wte", Embedding(vocab_size, hidden), (IDS,)),
        Node("wpe", PositionEmbedding(max_positions), ("wte",)),
        Node("drop", Dropout(dropout), ("wpe",)),
    ]
    pad = None
    if mask:
        pad = "extended_attention_mask"
        nodes.append(Node(pad, AttentionMask(), (IDS, MASK)))
    source = "drop"
    for i in range(layers):
        nodes += decoder_block(f"h.{i}", source, pad, cfg)
        source = nodes[-1].name
    nodes += [Node("ln_f", LayerNorm(eps), (source,)), Node("lm_head", Dense(vocab_size), ("ln_f",))]
    inputs = _inputs(seq_len, max_positions, mask, what)
    return Model.from_nodes(nodes, name=name, init="textbook", inputs=inputs, init_scale=0.02)


def gpt_small(num_classes: int = 97, input_shape: Sequence[int] = (128,)) -> Model:
    """The GPT that ``multigpu train --model gpt`` trains: 4 pre-norm blocks, hidden 256, 4 heads,
    dropout 0.1, for a vocabulary of ``num_classes`` tokens (the character tokenizer's 97) and
    windows of ``input_shape[0]`` tokens; 3,242,081 parameters with the defaults."""
    (seq_len,) = input_shape
    return gpt(
        vocab_size=num_classes, hidden=256, layers=4, heads=4, max_positions=seq_len, seq_len=seq_len, name="gpt"
    )


def bert_base(input_shape: Sequence[int] = (128,)) -> Model:
    """BERT-base (``bert()``'s defaults) measured at ``input_shape[0]`` tokens, with a padding mask."""
    (seq_len,) = input_shape
    return bert(seq_len=seq_len, name="bert")


def minilm(input_shape: Sequence[int] = (16,)) -> Model:
    """all-MiniLM-L6-v2's architecture (6 post-norm blocks, hidden 384, 12 heads, FFN 1536, erf
    GELU, eps 1e-12) measured at ``input_shape[0]`` tokens (a sentence), with a padding mask;
    ``pretrained("all-MiniLM-L6-v2")`` loads its weights."""
    (seq_len,) = input_shape
    return bert(hidden=384, layers=6, heads=12, ffn=1536, seq_len=seq_len, name="minilm")
