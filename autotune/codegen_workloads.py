"""The workload's part of ``train_autotuned.py``, filled in by ``autotune.codegen`` (``$workload``
in ``codegen_templates.SCRIPT``). No torch import here.

One text per kind of workload, each defining ``build_model``, ``get_batch``, ``compute_loss``,
``count_loss_items``, ``make_optimizer`` and ``model_blocks``: ``TINY_GPT``, the built-in model
(``autotune.builtin_workloads.TinyGPT`` as plain source; a test keeps the two identical); ``HF``, a
Hugging Face model rebuilt from its config (``HF_AUTO``: its Auto class per task;
``HF_COUNTS``: its ``count_loss_items``); ``FILE``, a ``file.py:factory`` workload imported by
path. ``$name`` placeholders are filled by ``string.Template``.
"""

TINY_GPT = '''
class Block(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.fc_out(nn.functional.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    """A GPT-2-style causal LM (pre-norm blocks, SDPA attention, tied embeddings)."""

    def __init__(self, *, vocab_size, seq_len, dim, num_layers, num_heads):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, num_heads) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids, labels):
        """Mean next-token cross-entropy over label tokens that are not -100."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok(input_ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
            ignore_index=-100,
        )


model_args = $sizes


def build_model():
    return TinyGPT(**model_args)


def get_batch(micro_batch):
    """Random tokens at the full sequence length: replace with your data."""
    ids = torch.randint(0, model_args["vocab_size"], (micro_batch, model_args["seq_len"]))
    return {"input_ids": ids, "labels": ids}


def compute_loss(model, batch):
    return model(**batch)


def count_loss_items(batch):
    """Label tokens the loss averages over (shifted by one, -100 ignored)."""
    return (batch["labels"][:, 1:] != -100).sum()


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-4)


model_blocks = None  # the repeated blocks to checkpoint: found by find_blocks() below
'''

HF = '''
model_name = $name  # a Hub id, or a local directory holding config.json
seq_len = $seq_len
$shipped


@functools.cache
def hf_config():
    """The model's config, read when first needed (so --help needs no network): from a local
    directory, the Hub or the local HF cache (HF_HUB_OFFLINE=1: the cache only)."""
    if shipped_config is not None and not os.path.isdir(model_name):
        try:  # the local cache, else the copy above: no network round trips
            return transformers.AutoConfig.from_pretrained(model_name, local_files_only=True)
        except (OSError, ValueError):
            return transformers.AutoConfig.for_model(**shipped_config)
    try:
        return transformers.AutoConfig.from_pretrained(model_name)
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"cannot load the config of {model_name!r} ({exc}). Set model_name above to a local "
            "directory holding its config.json, or run once with network access (after that "
            "HF_HUB_OFFLINE=1 reads it from the local HF cache)") from None


def build_model():
    return transformers.$auto.$build


def get_batch(micro_batch, length=seq_len):
    """Random tokens at the full sequence length: replace with your data."""
    ids = torch.randint(0, hf_config().vocab_size, (micro_batch, length))
    labels = $labels
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def compute_loss(model, batch):
    return model(**batch).loss

$count
def make_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-4)


model_blocks = None  # checkpointing uses the model's own switch
'''

HF_COUNTS = {
    "causal-lm": ('''
def count_loss_items(batch):
    """Label tokens the loss averages over (shifted by one, -100 ignored)."""
    return (batch["labels"][:, 1:] != -100).sum()

'''),
    "masked-lm": ('''
def count_loss_items(batch):
    """Label tokens the loss averages over (-100 ignored)."""
    return (batch["labels"] != -100).sum()

'''),
    "classifier": ("\ncount_loss_items = None  # one label per sample: micro-batches weigh alike"
                   "\n\n"),
}

HF_AUTO = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
            "classifier": "AutoModelForSequenceClassification"}

FILE = '''
# Your workload factory, imported by path under a private name (a file named model.v2.py or
# time.py imports as itself); its folder goes on sys.path for its own imports.
workload_file = $path
sys.path.insert(0, str(workload_file.parent))
workload_spec = importlib.util.spec_from_file_location("_autotune_workload", workload_file)
workload_module = importlib.util.module_from_spec(workload_spec)
sys.modules[workload_spec.name] = workload_module  # dataclasses and pickle look it up here
workload_spec.loader.exec_module(workload_module)
workload = vars(workload_module)[$factory]()  # the factory autotune.json names

build_model = workload.build_model
get_batch = workload.make_batch  # worst-case batches: replace with your data
compute_loss = workload.compute_loss
count_loss_items = workload.count_loss_items
make_optimizer = workload.make_optimizer
model_blocks = getattr(workload, "blocks", None)  # None: found by find_blocks() below
'''
