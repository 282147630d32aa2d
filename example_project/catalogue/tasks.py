"""The catalogue's debounced work.

- ``rebuild_search_document``: a debounced receiver of ``Product`` saves. An admin form saved
  three times, or an import touching a product again and again, rebuilds its search document
  once, ``wait`` seconds after the last save, from the row as committed then.
- ``recompute_category_stats``: a debounced task keyed per category; every product save or
  delete triggers it, and each category's aggregates are recomputed once per burst.
- ``import_prices``: a plain Celery task (not debounced) that sets prices with
  ``QuerySet.update``, which sends no signals, so it triggers the search documents itself
  with ``trigger_many``.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import Avg, Count
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from django_debounce import RunInfo, debounced_receiver, debounced_task, trigger_many
from example_project.catalogue.models import Category, CategoryStats, Product
from example_project.catalogue.search import index_product


@debounced_receiver(
    post_save,
    sender=Product,
    wait=settings.CATALOGUE_SEARCH_WAIT,  # 2 s unless the environment says otherwise
    max_wait=max(30, settings.CATALOGUE_SEARCH_WAIT),
    name="catalogue.rebuild_search_document",
)
def rebuild_search_document(
    sender: Any, instance: Product | None, pk: Any, debounce: RunInfo, **kwargs: Any
) -> None:
    """Runs in the worker; ``instance`` is the product as committed now, not as first saved."""
    if instance is None:  # deleted since; its document went with it (on_delete=CASCADE)
        return
    index_product(instance, triggers=debounce.triggers)


@debounced_task(
    wait=settings.CATALOGUE_STATS_WAIT,  # 5 s unless the environment says otherwise
    max_wait=max(60, settings.CATALOGUE_STATS_WAIT),
    key=lambda category_id: f"category:{category_id}",
    name="catalogue.recompute_category_stats",
)
def recompute_category_stats(category_id: int, *, debounce: RunInfo) -> None:
    """Recompute one category's aggregates (once per burst of its products' changes)."""
    category = Category.objects.filter(pk=category_id).first()
    if category is None:
        return
    agg = Product.objects.filter(category_id=category_id).aggregate(n=Count("id"), avg=Avg("price"))
    CategoryStats.objects.update_or_create(
        category=category, defaults={"product_count": agg["n"], "avg_price": agg["avg"]}
    )


@receiver(post_save, sender=Product, dispatch_uid="catalogue.product_saved_stats")
@receiver(post_delete, sender=Product, dispatch_uid="catalogue.product_deleted_stats")
def product_changed(sender: Any, instance: Product, **kwargs: Any) -> None:
    """Trigger the stats of the product's category (and of its old one, after a move)."""
    ids = {instance.category_id, getattr(instance, "_loaded_category_id", None)}
    for category_id in sorted(i for i in ids if i is not None):
        recompute_category_stats.trigger(category_id)
    instance._loaded_category_id = instance.category_id


@shared_task(name="catalogue.import_prices")
def import_prices(prices: dict[str, str]) -> int:
    """Set the price of each product named by primary key in ``prices`` (``{"42": "19.90"}``,
    as a price feed gives them); returns how many products changed. ``QuerySet.update`` sends
    no signals, so the search documents of the changed products are triggered here; the
    category statistics are the caller's (the manual chains
    ``recompute_category_stats.trigger_s(category_id)`` after it)."""
    changed = [
        pk for pk, price in prices.items() if Product.objects.filter(pk=pk).update(price=price)
    ]
    trigger_many(
        rebuild_search_document, Product.objects.filter(pk__in=changed).values_list("pk", flat=True)
    )
    return len(changed)
