from django.db import models


class Order(models.Model):
    email = models.EmailField()
    receipt_sent = models.BooleanField(default=False)
