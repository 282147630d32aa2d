"""The catalogue's search documents: what a search index would hold for a product."""

from __future__ import annotations

from example_project.catalogue.models import Product, SearchDocument


def index_product(product: Product, *, triggers: int = 0) -> SearchDocument:
    """(Re)build the search document of ``product`` from the row as given; ``triggers``: the
    saves the rebuild covers (shown in the admin)."""
    text = " ".join([product.name, product.category.name, f"{product.price}"])
    document, _created = SearchDocument.objects.update_or_create(
        product_id=product.pk,
        defaults={"text": text, "product_version": product.version, "triggers": triggers},
    )
    return document
