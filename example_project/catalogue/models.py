"""Catalogue models: products are edited often; their search documents and per-category
statistics are derived data, rebuilt by debounced work in the Celery worker."""

from __future__ import annotations

from typing import Any

from django.db import models


class Category(models.Model):
    name = models.CharField(max_length=100, unique=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "categories"

    def __str__(self) -> str:
        return self.name


class Product(models.Model):
    name = models.CharField(max_length=200)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    category = models.ForeignKey(Category, on_delete=models.CASCADE, related_name="products")
    version = models.PositiveIntegerField(
        default=0,
        editable=False,
        help_text="+1 at every save; derived data records the version it saw.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.version = (self.version or 0) + 1
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "version"}
        super().save(*args, **kwargs)

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any) -> Product:
        instance = super().from_db(db, field_names, values)
        # Remember the category as loaded, so a move refreshes the old category's stats too.
        instance._loaded_category_id = instance.__dict__.get("category_id")
        return instance


class SearchDocument(models.Model):
    """What a search index would hold for a product; rebuilt from the latest committed row."""

    product = models.OneToOneField(
        Product, on_delete=models.CASCADE, related_name="search_document"
    )
    text = models.TextField()
    product_version = models.PositiveIntegerField(
        help_text="Product.version this document was built from."
    )
    built_at = models.DateTimeField(auto_now=True)
    triggers = models.PositiveIntegerField(default=0, help_text="Saves the last rebuild covered.")

    def __str__(self) -> str:
        return f"search document of {self.product}"


class CategoryStats(models.Model):
    """Aggregates of a category; recomputed once per burst of product changes."""

    category = models.OneToOneField(Category, on_delete=models.CASCADE, related_name="stats")
    product_count = models.PositiveIntegerField(default=0)
    avg_price = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    computed_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "category stats"

    def __str__(self) -> str:
        return f"stats of {self.category}"
