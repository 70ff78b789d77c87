from typing import TypedDict


class Item(TypedDict):
    sku: str
    price: float


def item(sku: str) -> Item:
    return {"sku": sku, "price": 1.0}
