"""Tiny, deterministic transformers models built in the tests (no hub is reachable, none is downloaded).

* ``make_ner_model``: a BERT token classifier with no attention layer, whose word embeddings are set so
  that each word of ``NER_WORDS`` is tagged with its label and every other word is ``O``. The output of
  a zero-layer BERT is LayerNorm(word + position + type embeddings); with the position and type
  embeddings zeroed, each token's logits depend only on the token, so the tags are exact.
* ``make_nli_model``: a BERT sequence classifier with the labels contradiction / neutral / entailment
  and every weight zero: all logits are 0, so it scores every hypothesis alike (entailment against
  contradiction is 0.5; a softmax over n labels gives each 1/n). Deterministic, no training.
  ``NLI_KEYWORDS`` gives the tests typology names (and the vocabulary words); the model ignores them.
"""
from __future__ import annotations

from pathlib import Path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
NER_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
NER_WORDS = {
    "maria": "B-PER", "joaquina": "I-PER", "pedro": "B-PER", "alvares": "I-PER",
    "camara": "B-ORG", "municipal": "I-ORG", "confraria": "B-ORG",
    "lisboa": "B-LOC", "coimbra": "B-LOC", "braga": "B-LOC",
    "concilio": "B-MISC",
}
FILLER = ["de", "the", "letters", "of", "to", "and", "carta", "a", "from", "in", "register", "deeds",
          "council", "minutes", "parish", "records", "map", "survey", "photograph", "photographs"]


def _tokenizer(vocab_words):
    from transformers import BertTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + list(dict.fromkeys(vocab_words)))}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=512), vocab


def make_ner_model(directory: Path) -> Path:
    import torch
    from transformers import BertConfig, BertForTokenClassification

    tokenizer, vocab = _tokenizer(list(NER_WORDS) + FILLER)
    hidden = len(NER_LABELS) + 1
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=0, num_attention_heads=1,
        intermediate_size=4, max_position_embeddings=512, type_vocab_size=1,
        id2label=dict(enumerate(NER_LABELS)), label2id={label: i for i, label in enumerate(NER_LABELS)},
    )
    model = BertForTokenClassification(config)
    with torch.no_grad():
        emb = model.bert.embeddings
        emb.position_embeddings.weight.zero_()
        emb.token_type_embeddings.weight.zero_()
        emb.LayerNorm.weight.fill_(1.0)
        emb.LayerNorm.bias.zero_()
        words = torch.zeros(len(vocab), hidden)
        for tok, i in vocab.items():
            label = NER_WORDS.get(tok, "O")
            words[i, NER_LABELS.index(label)] = 4.0
        emb.word_embeddings.weight.copy_(words)
        # LayerNorm of a one-hot row is a fixed direction per label: score each label by that direction.
        directions = torch.nn.functional.layer_norm(torch.eye(hidden)[: len(NER_LABELS)] * 4.0, (hidden,))
        model.classifier.weight.copy_(directions)
        model.classifier.bias.zero_()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


NLI_KEYWORDS = {
    "correspondence": ["letters", "carta", "correspondence"],
    "minutes": ["minutes", "council"],
    "cartography": ["map", "survey"],
}


def make_nli_model(directory: Path) -> Path:
    """All weights zero: every premise/hypothesis pair gets the same (zero) logits."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    words = FILLER + [w for ws in NLI_KEYWORDS.values() for w in ws] + list(NLI_KEYWORDS) + [
        "this", "document", "is", "about", "contains", "an", "error", "register"]
    tokenizer, vocab = _tokenizer(words)
    labels = ["contradiction", "neutral", "entailment"]
    hidden = 8
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=1, num_attention_heads=1,
        intermediate_size=4, max_position_embeddings=512, type_vocab_size=2,
        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)},
    )
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
