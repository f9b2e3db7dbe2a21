// A Java peer for the records layer's broker fixtures: the real Java client writes committed, aborted and
// still-open transactions (one topic per codec), then the real Java consumer reads each topic at
// read_committed and at read_uncommitted and writes down what it delivered.
//
// Usage: java -cp "<kafka libs>/*" RecordsFixture.java <bootstrap> <topic prefix> <out dir>
// Writes <out dir>/<codec>/java_read_committed.txt and java_read_uncommitted.txt, one delivered record a
// line: offset, key, value, headers (k=v,... or -), tab-separated; the first line is "# end <offset>", the
// consumer's end offset at that isolation level (the LSO at read_committed, the high watermark otherwise).
// Then it halts without closing the producers, so the last transaction of producer t3 stays open.

import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.StringJoiner;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class RecordsFixture {
    static final List<String> CODECS = List.of("none", "gzip", "snappy", "lz4", "zstd");

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String prefix = args[1];
        Path out = Paths.get(args[2]);
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            for (String codec : CODECS) {
                admin.createTopics(List.of(new NewTopic(prefix + "-" + codec, 1, (short) 1))).all().get();
            }
        }
        for (String codec : CODECS) {
            String topic = prefix + "-" + codec;
            write(bootstrap, topic, codec);
            Path dir = out.resolve(codec);
            Files.createDirectories(dir);
            dump(bootstrap, topic, "read_committed", dir.resolve("java_read_committed.txt"));
            dump(bootstrap, topic, "read_uncommitted", dir.resolve("java_read_uncommitted.txt"));
        }
        System.out.flush();
        // No close(): closing could end t3's transaction, which must stay open.
        Runtime.getRuntime().halt(0);
    }

    static void write(String bootstrap, String topic, String codec) throws Exception {
        KafkaProducer<String, String> t1 = producer(bootstrap, codec, topic + "-t1");
        KafkaProducer<String, String> t2 = producer(bootstrap, codec, topic + "-t2");
        KafkaProducer<String, String> t3 = producer(bootstrap, codec, topic + "-t3");
        KafkaProducer<String, String> plain = producer(bootstrap, codec, null);

        // t1 commits a batch of three.
        t1.beginTransaction();
        send(t1, topic, "c", 1, 3);
        t1.commitTransaction();
        // t2 begins a transaction that ends aborted; a t1 commit and plain records land inside it.
        t2.beginTransaction();
        send(t2, topic, "a", 1, 2);
        t2.flush();
        t1.beginTransaction();
        send(t1, topic, "c", 4, 1);
        t1.commitTransaction();
        send(plain, topic, "p", 1, 2);
        plain.flush();
        send(t2, topic, "a", 3, 1);
        // Flushed first, or the abort would drop a3 unsent: the aborted transaction spans two batches.
        t2.flush();
        t2.abortTransaction();
        // After its abort, the same producer commits a fresh transaction.
        t2.beginTransaction();
        send(t2, topic, "c", 5, 2);
        t2.commitTransaction();
        // t3 stays open: everything after its first record is beyond the LSO, committed or not.
        t3.beginTransaction();
        send(t3, topic, "o", 1, 2);
        t3.flush();
        send(plain, topic, "p", 3, 1);
        plain.flush();
        t1.beginTransaction();
        send(t1, topic, "c", 7, 1);
        t1.commitTransaction();
    }

    static KafkaProducer<String, String> producer(String bootstrap, String codec, String transactionalId) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("compression.type", codec);
        p.put("linger.ms", "20");
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        if (transactionalId == null) {
            p.put("enable.idempotence", "false");
            p.put("acks", "1");
        } else {
            p.put("transactional.id", transactionalId);
            // Long enough that t3's open transaction outlives the test that reads it.
            p.put("transaction.timeout.ms", "900000");
        }
        KafkaProducer<String, String> producer = new KafkaProducer<>(p);
        if (transactionalId != null) {
            producer.initTransactions();
        }
        return producer;
    }

    /** Sends `count` records named prefix+from.. asynchronously, so they share a batch. */
    static void send(KafkaProducer<String, String> producer, String topic, String prefix, int from, int count) {
        for (int i = from; i < from + count; i++) {
            String key = prefix + i;
            ProducerRecord<String, String> r = new ProducerRecord<>(topic, 0, key, "value-" + key + "-" + "x".repeat(40));
            if (i % 2 == 1) {
                r.headers().add("h", ("hv-" + key).getBytes(StandardCharsets.UTF_8));
            }
            producer.send(r);
        }
    }

    static void dump(String bootstrap, String topic, String isolation, Path file) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("isolation.level", isolation);
        p.put("enable.auto.commit", "false");
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(p);
             PrintWriter w = new PrintWriter(Files.newBufferedWriter(file))) {
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long end = consumer.endOffsets(List.of(tp)).get(tp);
            w.println("# end " + end);
            long deadline = System.currentTimeMillis() + 60_000;
            while (consumer.position(tp) < end) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException(isolation + " consumer stuck at " + consumer.position(tp) + " < " + end);
                }
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    StringJoiner h = new StringJoiner(",");
                    for (Header header : r.headers()) {
                        h.add(header.key() + "=" + new String(header.value(), StandardCharsets.UTF_8));
                    }
                    String headers = h.length() == 0 ? "-" : h.toString();
                    w.println(r.offset() + "\t" + r.key() + "\t" + r.value() + "\t" + headers);
                }
            }
        }
    }
}
