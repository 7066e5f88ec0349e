"""Training data: synthetic tokens, local text or streamed data files, as resumable per-rank iterators of Batches."""

# ruff: noqa: F401  (the package re-exports its modules' public names)

from titan_core.data.base import IGNORE_INDEX, Batch, RowLoader
from titan_core.data.dataset import DatasetLoader, report_data
from titan_core.data.hf_tokenizer import HfTokenizer, load_hf_tokenizer
from titan_core.data.loader import SyntheticLoader, build_data_loader
from titan_core.data.text import TextLoader, split_documents
from titan_core.data.tokenizer import BpeTokenizer, ByteTokenizer, build_tokenizer, load_or_train_bpe
