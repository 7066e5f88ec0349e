"""Training data: synthetic tokens, local text or streamed data files, as resumable per-rank iterators of Batches."""

from titan_core.data.base import IGNORE_INDEX, Batch, RowLoader
from titan_core.data.dataset import DatasetLoader, report_data
from titan_core.data.hf_tokenizer import HfTokenizer, load_hf_tokenizer
from titan_core.data.loader import SyntheticLoader, build_data_loader
from titan_core.data.text import TextLoader, split_documents
from titan_core.data.tokenizer import BpeTokenizer, ByteTokenizer, build_tokenizer, load_or_train_bpe

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "BpeTokenizer",
    "ByteTokenizer",
    "DatasetLoader",
    "HfTokenizer",
    "RowLoader",
    "SyntheticLoader",
    "TextLoader",
    "build_data_loader",
    "build_tokenizer",
    "load_hf_tokenizer",
    "load_or_train_bpe",
    "report_data",
    "split_documents",
]
