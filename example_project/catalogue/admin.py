from django.contrib import admin

from example_project.catalogue.models import Category, CategoryStats, Product, SearchDocument


@admin.register(Category)
class CategoryAdmin(admin.ModelAdmin):
    list_display = ["name", "product_total"]
    search_fields = ["name"]

    @admin.display(description="products")
    def product_total(self, obj: Category) -> int:
        return obj.products.count()


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ["name", "category", "price", "version"]
    list_filter = ["category"]
    search_fields = ["name"]
    readonly_fields = ["version"]


class DerivedAdmin(admin.ModelAdmin):
    """Derived data is written by the worker only."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(SearchDocument)
class SearchDocumentAdmin(DerivedAdmin):
    list_display = ["product", "product_version", "triggers", "built_at"]
    search_fields = ["text", "product__name"]


@admin.register(CategoryStats)
class CategoryStatsAdmin(DerivedAdmin):
    list_display = ["category", "product_count", "avg_price", "computed_at"]
