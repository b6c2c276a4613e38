#!/usr/bin/env python3
"""Write the demo collection (scrinalia/domains/archive/demo/collection.jsonl): ~200 ISAD(G)-style
descriptions of an imaginary Iberian municipal and diocesan archive, reproducible (seeded).

A handful are deliberately flawed so the quality validator has something to find: titles in capitals,
a placeholder title, a repeated word, duplicate titles, a missing date and a date in the future.

    python scripts/make_demo_collection.py            # rewrite the shipped file
"""
from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "scrinalia" / "domains" / "archive" / "demo" / "collection.jsonl"

PLACES = ["Coimbra", "Braga", "Évora", "Lisboa", "Porto", "Viseu", "Guimarães", "Tomar", "Lamego", "Aveiro",
          "Santarém", "Leiria", "Salamanca", "Sevilha", "Toledo", "Montemor-o-Velho", "Beja", "Faro"]
PEOPLE = ["Maria Joaquina de Sousa", "Pedro Álvares Cabral", "João Baptista Ferreira", "Ana Rita Moniz",
          "Francisco Xavier de Almeida", "Isabel de Castro", "Manuel Pinheiro Chagas", "Catarina Vaz",
          "António José Teixeira", "Luísa de Meneses", "Domingos Rebelo", "Teresa de Jesus Barbosa",
          "Bernardo Lemos Pacheco", "Joana Carlota Vieira", "Tomé Gonçalves", "Rosa Maria do Carmo"]
BODIES = ["Câmara Municipal", "Santa Casa da Misericórdia", "Cabido da Sé", "Confraria do Santíssimo",
          "Companhia Geral da Agricultura das Vinhas do Alto Douro", "Real Fábrica de Sedas",
          "Hospital Real de Todos os Santos", "Universidade de Coimbra", "Colégio de São Paulo",
          "Alfândega", "Juízo de Fora", "Governo Civil", "Companhia de Navegação a Vapor",
          "Associação Comercial", "Liceu Nacional", "Repartição de Obras Públicas"]

SERIES = [
    ("minutes", "Minutes of the sessions of the {body} of {place}",
     "Bound minute books recording the deliberations of the {body} of {place}: appointments of officials, "
     "municipal finances, public works, markets and fairs, public health measures and petitions from residents. "
     "Entries are signed by the clerk and the presiding magistrate.",
     "The {body} of {place} administered the town and its district, with jurisdiction over markets, "
     "weights and measures, roads and the municipal treasury.", "volumes"),
    ("correspondence", "Letters of {person} to the {body} of {place}",
     "Incoming and outgoing correspondence of {person} concerning {topic}. Includes drafts, fair copies and "
     "a few enclosures (accounts, receipts, a printed circular).",
     "{person} held office in {place} and corresponded regularly with local and central authorities.", "letters"),
    ("register", "Parish register of baptisms, marriages and burials of {place}",
     "Registers kept by the parish priests of {place}, recording baptisms with godparents, marriages with "
     "witnesses and burials with the cause of death where given. Marginal notes record later legitimations.",
     "The parish of {place} kept sacramental registers from the late sixteenth century, following the decrees "
     "of the Council of Trent.", "volumes"),
    ("deeds", "Notarial deeds of the notary of {place}",
     "Protocol books of notarial deeds: sales of land and houses, leases, dowry contracts, wills, powers of "
     "attorney and debt acknowledgements drawn up in {place} and its district.",
     "The public notaries of {place} were appointed by the Crown and kept their protocols in the town hall.",
     "books"),
    ("cartography", "Map of the {topic2} of {place}",
     "Manuscript map, ink and watercolour on paper, showing {topic2} of {place}, with a scale in fathoms, "
     "a compass rose and a legend of the main buildings, roads and water courses.",
     "Drawn by military engineers for the {body} of {place} during the planning of public works.", "sheets"),
    ("photograph", "Photographs of {topic3} in {place}",
     "Gelatin silver prints and glass plate negatives documenting {topic3} in {place}: street views, "
     "building works, ceremonies and portraits of the people involved.",
     "Commissioned by the {body} of {place} from a local photographic studio.", "photographs"),
    ("accounts", "Account books of the {body} of {place}",
     "Annual accounts of revenue and expenditure of the {body} of {place}: rents, tithes, alms, salaries, "
     "building repairs and purchases of wax, oil and cloth, audited by the visitors.",
     "The {body} of {place} administered property and revenues for charitable and religious purposes.",
     "volumes"),
    ("lawsuit", "Lawsuit between {person} and the {body} of {place}",
     "Records of a civil suit over {topic}: petitions, witness depositions, sentences at first instance "
     "and on appeal, and the costs of the proceedings.",
     "The case was heard before the {body} of {place} and appealed to the Casa da Suplicação.", "files"),
    ("statutes", "Statutes and membership rolls of the {body} of {place}",
     "Founding statutes, later amendments approved by the bishop, and rolls of brothers and sisters admitted, "
     "with their entry fees and offices held.",
     "The {body} of {place} was a lay confraternity devoted to worship, burial of members and poor relief.",
     "volumes"),
    ("hospital", "Admission registers of the {body} of {place}",
     "Registers of patients admitted, with name, origin, age, illness, date of discharge or death, and the "
     "belongings kept on admission.",
     "The {body} of {place} ran a hospital for the poor, the sick and travellers.", "volumes"),
    ("school", "Enrolment and examination records of the {body} of {place}",
     "Registers of enrolment, attendance and examination results, reports of inspectors and correspondence "
     "about teachers' appointments and school buildings.",
     "The {body} of {place} provided secondary education to the sons and, later, daughters of the district.",
     "files"),
    ("customs", "Customs books of the {body} of {place}",
     "Books recording ships entering and leaving the port of {place}, their masters, cargoes of wine, salt, "
     "grain, textiles and sugar, and the duties paid.",
     "The {body} of {place} collected royal duties on goods entering and leaving by sea and river.", "books"),
]

TOPICS = ["the supply of water to the town", "the rebuilding of the bridge after the floods",
          "the payment of tithes", "an inheritance dispute", "the cholera epidemic", "the price of bread",
          "the recruitment of soldiers", "the lighting of the streets", "the repair of the town walls",
          "a loan to the municipality", "the building of the new market", "grazing rights on common land"]
TOPICS2 = ["the town and its surroundings", "the river and the harbour", "the new road to the coast",
           "the estates of the monastery", "the proposed railway line", "the parish boundaries"]
TOPICS3 = ["the building of the municipal market", "the royal visit", "the floods", "the inauguration of the tramway",
           "the procession of Corpus Christi", "the restoration of the cathedral"]
# Which bodies fit which series (a parish register is not a town council's minute book).
SERIES_BODIES = {
    "minutes": ["Câmara Municipal", "Governo Civil", "Associação Comercial", "Cabido da Sé"],
    "correspondence": BODIES,
    "register": ["Cabido da Sé"],
    "deeds": ["Juízo de Fora", "Câmara Municipal"],
    "cartography": ["Câmara Municipal", "Repartição de Obras Públicas", "Governo Civil"],
    "photograph": ["Câmara Municipal", "Repartição de Obras Públicas", "Companhia de Navegação a Vapor"],
    "accounts": ["Santa Casa da Misericórdia", "Confraria do Santíssimo", "Cabido da Sé", "Real Fábrica de Sedas"],
    "lawsuit": ["Juízo de Fora", "Câmara Municipal", "Santa Casa da Misericórdia"],
    "statutes": ["Confraria do Santíssimo", "Santa Casa da Misericórdia", "Associação Comercial"],
    "hospital": ["Santa Casa da Misericórdia", "Hospital Real de Todos os Santos"],
    "school": ["Liceu Nacional", "Colégio de São Paulo", "Universidade de Coimbra"],
    "customs": ["Alfândega", "Companhia Geral da Agricultura das Vinhas do Alto Douro"],
}
LANGS = ["por", "por", "por", "spa", "lat", "por; lat", "eng", "fre"]
LEVELS = ["fonds", "series", "series", "file", "file", "item"]


def make() -> list[dict]:
    rng = random.Random(1492)
    docs = []
    for i in range(1, 193):
        kind, title_t, scope_t, hist_t, unit = SERIES[(i - 1) % len(SERIES)]
        vals = dict(place=rng.choice(PLACES), person=rng.choice(PEOPLE), body=rng.choice(SERIES_BODIES[kind]),
                    topic=rng.choice(TOPICS), topic2=rng.choice(TOPICS2), topic3=rng.choice(TOPICS3))
        start = rng.randint(1550, 1950)
        end = min(start + rng.choice([0, 0, 1, 5, 12, 30, 60]), 1990)
        level = rng.choice(LEVELS)
        extent = f"{rng.randint(1, 80)} {unit}"
        docs.append({
            "reference_code": f"PT/SCR/{kind.upper()[:3]}/{i:04d}",
            "title": title_t.format(**vals) + (f", {start}" if end == start else f", {start}-{end}"),
            "scope_and_content": scope_t.format(**vals),
            "admin_biographical_history": hist_t.format(**vals),
            "provenance": rng.choice([
                f"Transferred from the {vals['body']} of {vals['place']} in {rng.randint(1890, 1990)}.",
                f"Purchased at auction in {rng.randint(1900, 2010)}.",
                f"Donated by the family of {vals['person']} in {rng.randint(1920, 2015)}.",
                f"Incorporated with the records of the district archive of {vals['place']}.",
            ]),
            "date_text": f"{start}" if end == start else f"{start}-{end}",
            "date_start": f"{start}-01-01",
            "date_end": f"{end}-12-31",
            "level": level,
            "extent": extent,
            "language": rng.choice(LANGS),
            "creator": f"{vals['body']} de {vals['place']}" if kind not in ("correspondence",) else vals["person"],
            "status": rng.choice(["DRAFT", "DRAFT", "PUBLISHED"]),
        })
    flawed = [
        {"reference_code": "PT/SCR/FLW/0001", "title": "REGISTO DE TESTAMENTOS DA CÂMARA DE BRAGA",
         "scope_and_content": "Copies of wills registered by the town council of Braga.",
         "date_text": "1701-1745", "date_start": "1701-01-01", "date_end": "1745-12-31"},
        {"reference_code": "PT/SCR/FLW/0002", "title": "CORRESPONDENCE OF THE BISHOP OF LAMEGO",
         "scope_and_content": "Letters received by the bishop from parish priests of the diocese.",
         "date_text": "1820", "date_start": "1820-01-01", "date_end": "1820-12-31"},
        {"reference_code": "PT/SCR/FLW/0003", "title": "Untitled",
         "scope_and_content": "A bundle of loose papers found in a cupboard of the sacristy; not yet described.",
         "date_text": "s.d."},
        {"reference_code": "PT/SCR/FLW/0004", "title": "Plan of the the cemetery of Viseu",
         "scope_and_content": "Plan for the enlargement of the municipal cemetery, with the new chapel.",
         "date_text": "1881", "date_start": "1881-01-01", "date_end": "1881-12-31"},
        {"reference_code": "PT/SCR/FLW/0005", "title": "Letters of the parish priest of Tomar",
         "scope_and_content": "Letters of the parish priest of Tomar to the bishop about the state of the church."},
        {"reference_code": "PT/SCR/FLW/0006", "title": "Letters of the parish priest of Tomar",
         "scope_and_content": "Further letters of the parish priest of Tomar, about the confraternities.",
         "date_text": "1799", "date_start": "1799-01-01", "date_end": "1799-12-31"},
        {"reference_code": "PT/SCR/FLW/0007", "title": "Digitisation project plan for the municipal fonds",
         "scope_and_content": "Planning documents for a digitisation project, misdated at cataloguing.",
         "date_text": "2099", "date_start": "2099-01-01", "date_end": "2099-12-31"},
        {"reference_code": "PT/SCR/FLW/0008", "title": "[title]",
         "scope_and_content": "Record created from a template and never completed.  Lorem ipsum dolor sit amet.",
         "date_text": "1900", "date_start": "1900-01-01", "date_end": "1900-12-31"},
    ]
    for doc in flawed:
        doc.setdefault("level", "file")
        doc.setdefault("status", "DRAFT")
    docs.extend(flawed)
    return docs


def main() -> None:
    docs = make()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8") as fh:
        for doc in docs:
            fh.write(json.dumps(doc, ensure_ascii=False) + "\n")
    print(f"{len(docs)} descriptions written to {OUT}")


if __name__ == "__main__":
    main()
